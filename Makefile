# sloserve: build, fetch the default model, serve, test.
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
CARGO ?= cargo

.PHONY: all model build release test test-rust fmt clippy clean

all: build

model:
	./scripts/fetch-model.sh


build:
	$(CARGO) build

release:
	$(CARGO) build --release

# Every test: unit tests, the model against llama.cpp's reference, the engine.
test: model
	$(CARGO) test --workspace --no-fail-fast

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets

clean:
	$(CARGO) clean
