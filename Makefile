# sloserve: build, fetch the default model, serve, test.
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
CARGO ?= cargo

.PHONY: all model build release serve test test-rust test-python fmt clippy clean

all: build

model:
	./scripts/fetch-model.sh


build:
	$(CARGO) build

release:
	$(CARGO) build --release

# The OpenAI-compatible server on 127.0.0.1:8000; extra flags: make serve ARGS="--profile mixed".
serve: model release
	./target/release/sloserve serve $(ARGS)

# Every test: unit tests, the model against llama.cpp's reference, the engine.
test: model
	$(CARGO) test --workspace --no-fail-fast
	$(MAKE) test-python

# The real `openai` Python SDK and the README's curl examples against `sloserve serve`.
VENV := .venv
$(VENV)/.openai-installed:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check openai
	touch $@

test-python: model $(VENV)/.openai-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python tests/python/test_openai_sdk.py --bin target/debug/sloserve

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets

clean:
	$(CARGO) clean
