#!/usr/bin/env python3
"""Validates deploy/kubernetes offline (run by `make test`).

1. Renders the kustomization: with `kubectl kustomize` when kubectl is installed,
   and always with the small renderer below (resources, configMapGenerator, labels,
   images); when both ran, their outputs must agree (modulo kustomize's name hashes).
2. Built-in kinds against Kubernetes' schemas with `kubernetes-validate` (strict).
3. InferencePool and InferenceObjective against their CRDs' openAPIV3Schema
   (deploy/kubernetes/crds/, copied from ../shared/reference/kubernetes) with jsonschema.
4. The contract between the pieces: pools select the fleets' pods, objectives name
   pools (interactive priority 10, batch -1), the HTTPRoute's backends exist, pods
   carry llm-d.ai/engine-type: vllm, probe /health and /ready, and their grace
   period covers preStop + the server's drain; the init container's fetch script is
   scripts/fetch-model.sh; with --bin, each fleet's TOML loads in `sloserve serve`.
5. Self-check: a broken copy of each kind must be rejected.
"""
import argparse
import copy
import pathlib
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
KDIR = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.37.0"
CRD_KINDS = {
    "InferencePool": "inference.networking.k8s.io_inferencepools.yaml",
    "InferenceObjective": "llm-d.ai_inferenceobjectives.yaml",
}


def render_python():
    """Applies the kustomization's resources, configMapGenerator, labels and images."""
    k = yaml.safe_load((KDIR / "kustomization.yaml").read_text())
    docs = []
    for gen in k.get("configMapGenerator", []):
        data = {}
        for f in gen["files"]:
            key, _, path = f.partition("=")
            data[key] = (KDIR / (path or key)).read_text()
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for r in k["resources"]:
        docs += [d for d in yaml.safe_load_all((KDIR / r).read_text()) if d]
    for lab in k.get("labels", []):
        for d in docs:
            d["metadata"].setdefault("labels", {}).update(lab["pairs"])
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in k.get("images", [])}
    for d in docs:
        spec = d.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            c["image"] = images.get(c["image"], c["image"])
    return docs


def render_kubectl():
    out = subprocess.run(["kubectl", "kustomize", str(KDIR)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def strip_hashes(docs):
    """kustomize's generated names end in -<hash>; drop it everywhere."""
    names = {}
    for d in docs:
        if d["kind"] == "ConfigMap":
            base = d["metadata"]["name"].rsplit("-", 1)[0]
            names[d["metadata"]["name"]] = base
    text = yaml.safe_dump_all(docs, sort_keys=True)
    for full, base in names.items():
        text = text.replace(full, base)
    return list(yaml.safe_load_all(text))


def key(d):
    return (d["kind"], d["metadata"]["name"])


def strict(schema):
    """Rejects unknown fields, as `kubectl apply --validate=strict` does for a CRD
    with a structural schema (the schemas themselves only prune them)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def crd_schema(kind):
    crd = yaml.safe_load((KDIR / "crds" / CRD_KINDS[kind]).read_text())
    versions = {v["name"]: strict(v["schema"]["openAPIV3Schema"]) for v in crd["spec"]["versions"]}
    return versions, crd["spec"]["group"]


def validate_doc(d):
    """Raises on a document its schema rejects; returns how it was checked."""
    if d["kind"] in CRD_KINDS:
        versions, group = crd_schema(d["kind"])
        g, _, v = d["apiVersion"].partition("/")
        if g != group or v not in versions:
            raise ValueError(f"{key(d)}: apiVersion {d['apiVersion']} is not served by the CRD")
        jsonschema.validate(d, versions[v])
        return "CRD openAPIV3Schema, strict"
    if d["kind"] == "HTTPRoute":
        return "structure (Gateway API schemas are not bundled)"
    kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    return f"kubernetes-validate {K8S_VERSION} strict"


def check_contract(docs, errors):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    deployments = by_kind.get("Deployment", [])
    pools = {p["metadata"]["name"]: p for p in by_kind.get("InferencePool", [])}
    configmaps = {c["metadata"]["name"] for c in by_kind.get("ConfigMap", [])}
    for dep in deployments:
        name = dep["metadata"]["name"]
        pod = dep["spec"]["template"]
        labels = pod["metadata"]["labels"]
        if labels.get("llm-d.ai/engine-type") != "vllm":
            errors.append(f"{name}: pod label llm-d.ai/engine-type: vllm missing")
        c = pod["spec"]["containers"][0]
        if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health":
            errors.append(f"{name}: liveness probe is not GET /health")
        if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/ready":
            errors.append(f"{name}: readiness probe is not GET /ready")
        args = dict(a.lstrip("-").split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
        drain = float(args.get("shutdown-timeout", 30))
        pre = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
        if pre <= 0 or grace < pre + drain:
            errors.append(f"{name}: grace {grace}s < preStop {pre}s + drain {drain}s")
        if not pod["spec"].get("securityContext", {}).get("runAsNonRoot"):
            errors.append(f"{name}: not runAsNonRoot")
        for v in pod["spec"].get("volumes", []):
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                errors.append(f"{name}: ConfigMap {v['configMap']['name']} is not defined")
        if not any(p["spec"]["selector"]["matchLabels"].items() <= labels.items() for p in pools.values()):
            errors.append(f"{name}: no InferencePool selects its pods")
    for pname, p in pools.items():
        sel = p["spec"]["selector"]["matchLabels"]
        if not any(sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items() for dep in deployments):
            errors.append(f"InferencePool {pname}: selects no Deployment's pods")
    prio = {}
    for o in by_kind.get("InferenceObjective", []):
        if o["spec"]["poolRef"]["name"] not in pools:
            errors.append(f"InferenceObjective {o['metadata']['name']}: pool {o['spec']['poolRef']['name']} missing")
        prio[o["metadata"]["name"]] = o["spec"].get("priority")
    if prio != {"interactive": 10, "batch": -1}:
        errors.append(f"objectives: want interactive 10 and batch -1, got {prio}")
    for r in by_kind.get("HTTPRoute", []):
        if not r["spec"].get("parentRefs"):
            errors.append(f"HTTPRoute {r['metadata']['name']}: no parentRefs")
        for rule in r["spec"]["rules"]:
            for b in rule["backendRefs"]:
                if b.get("kind") != "InferencePool" or b["name"] not in pools:
                    errors.append(f"HTTPRoute: backend {b} is not one of the InferencePools")
    if (KDIR / "fetch-model.sh").read_bytes() != (ROOT / "scripts" / "fetch-model.sh").read_bytes():
        errors.append("deploy/kubernetes/fetch-model.sh differs from scripts/fetch-model.sh: copy it again")


def check_configs(binary, errors):
    for profile in ("interactive", "batch"):
        r = subprocess.run([binary, "serve", f"--profile={profile}", f"--config={KDIR / (profile + '.toml')}", "--print-config"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            errors.append(f"{profile}.toml: sloserve serve rejects it: {r.stderr.strip()}")


def self_check(docs, errors):
    """A broken copy of each object must fail validation (the checks can fail)."""
    for d in docs:
        if d["kind"] == "HTTPRoute":
            continue
        bad = copy.deepcopy(d)
        bad.setdefault("spec", {})["notAField"] = 1
        if d["kind"] == "ConfigMap":
            bad = copy.deepcopy(d)
            bad["data"] = {"k": 1}
        try:
            validate_doc(bad)
            errors.append(f"self-check: a broken {d['kind']} passed validation")
        except Exception:
            pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", help="sloserve binary: also load each fleet's TOML")
    args = ap.parse_args()
    errors = []
    docs = render_python()
    renderer = "python renderer"
    if shutil.which("kubectl"):
        kdocs = strip_hashes(render_kubectl())
        if sorted(map(key, kdocs)) != sorted(map(key, docs)):
            errors.append(f"kubectl kustomize and the python renderer disagree on the objects: {sorted(map(key, kdocs))}")
        else:
            mine = {key(d): d for d in docs}
            for d in kdocs:
                if yaml.safe_dump(d, sort_keys=True) != yaml.safe_dump(mine[key(d)], sort_keys=True):
                    errors.append(f"kubectl kustomize and the python renderer disagree on {key(d)}")
        docs, renderer = kdocs, "kubectl kustomize (python renderer agrees)"
    print(f"rendered {len(docs)} objects with {renderer}")
    for d in docs:
        try:
            how = validate_doc(d)
            print(f"  ok  {d['kind']}/{d['metadata']['name']}: {how}")
        except Exception as e:
            errors.append(f"{d['kind']}/{d['metadata']['name']}: {str(e).splitlines()[0]}")
    check_contract(docs, errors)
    if args.bin:
        check_configs(args.bin, errors)
    self_check(docs, errors)
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    # Checks: each object's schema, each object's broken copy, the contract, the configs.
    checks = 2 * len(docs) + 1 + (1 if args.bin else 0)
    failed = min(len(errors), checks)
    print(f"{checks - failed} passed, {failed} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
