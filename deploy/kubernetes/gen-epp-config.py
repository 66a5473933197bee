#!/usr/bin/env python3
"""Writes deploy/kubernetes/epp-config.yaml from deploy/local/epp-config.yaml.

One EndpointPickerConfig serves both stacks: the local one (deploy/local, the EPP with
file discovery) and the cluster's (the ConfigMap sloserve-epp-config mounted by the EPP
Deployments of epp.yaml). The Kubernetes copy is the local file without its blocks
marked local only (from a comment line starting `# [local only]` through the line
`# [end local only]`): the file-discovery plugin and dataLayer.discovery, so that the
EPP discovers the pods of the InferencePool named by --pool-name. kustomize reads only
files below deploy/kubernetes, hence a copy; scripts/validate-k8s.py (`make test-k8s`)
fails when it is stale or when the two differ other than in discovery.

  deploy/kubernetes/gen-epp-config.py           rewrite the copy
  deploy/kubernetes/gen-epp-config.py --check   exit 1 if it is stale
"""
import argparse
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE.parent / "local" / "epp-config.yaml"
TARGET = HERE / "epp-config.yaml"
BEGIN = "# [local only]"
END = "# [end local only]"
HEADER = """\
# GENERATED from deploy/local/epp-config.yaml by deploy/kubernetes/gen-epp-config.py:
# edit that file and run the script. The same scheduling as the local stack; only
# discovery differs: no file-discovery plugin, so the EPP watches the pods of the
# InferencePool named by its --pool-name (epp.yaml).
"""


def generate(text):
    """The local config without its local-only blocks, under the generated header."""
    out, skipping = [], False
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        s = line.strip()
        if s.startswith(BEGIN):
            if skipping:
                raise ValueError(f"{SOURCE}:{n}: {BEGIN} inside a local-only block")
            skipping = True
        elif s == END:
            if not skipping:
                raise ValueError(f"{SOURCE}:{n}: {END} without {BEGIN}")
            skipping = False
        elif not skipping:
            out.append(line)
    if skipping:
        raise ValueError(f"{SOURCE}: {BEGIN} block not closed")
    body = "".join(out)
    if "${" in body:
        raise ValueError(f"{SOURCE}: a ${{...}} placeholder outside the local-only blocks")
    return HEADER + body


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the copy is current")
    args = ap.parse_args()
    want = generate(SOURCE.read_text())
    if args.check:
        if TARGET.read_text() != want:
            print(f"{TARGET} is stale: run {pathlib.Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(want)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
