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
5. The endpoint pickers (EPP): each InferencePool's endpointPickerRef names a Service
   whose port leads to the gRPC port of an EPP Deployment running for that pool
   (--pool-name, --pool-namespace, --config-file in the mounted ConfigMap, probes on the
   health port, the image tag deploy/local/gwinstall.py builds), the ServiceAccount it
   runs as is bound to a Role that reads pods, InferencePools and InferenceObjectives,
   and the ConfigMap's EndpointPickerConfig (deploy/kubernetes/epp-config.yaml) is
   current with deploy/local/epp-config.yaml (gen-epp-config.py), valid (the v1alpha1
   fields, decoded strictly as the EPP does; every pluginRef defined) and the same
   plugins, parameters, weights and profiles apart from discovery.
6. Self-check: a broken copy of each kind must be rejected, and so must a pool whose
   EPP is missing, an EPP without RBAC, and a Kubernetes config whose weights differ.
"""
import argparse
import copy
import importlib.util
import pathlib
import re
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
KDIR = ROOT / "deploy" / "kubernetes"
K8S_VERSION = "1.37.0"
LOCAL = ROOT / "deploy" / "local"
EPP_IMAGE = "ghcr.io/llm-d/llm-d-router-endpoint-picker"
EPP_LABEL = "sloserve-epp"  # app.kubernetes.io/name of the EPP pods
SLOSERVE_LABEL = "sloserve"  # app.kubernetes.io/name of the model-server pods
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
    deployments = [d for d in by_kind.get("Deployment", []) if app_name(d) == SLOSERVE_LABEL]
    for d in by_kind.get("Deployment", []):
        if app_name(d) not in (SLOSERVE_LABEL, EPP_LABEL):
            errors.append(f"Deployment {d['metadata']['name']}: pods labelled neither sloserve nor {EPP_LABEL}")
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
    check_epp(by_kind, errors)


def app_name(dep):
    return dep["spec"]["template"]["metadata"].get("labels", {}).get("app.kubernetes.io/name")


def flags(args):
    """`--k=v` and `--k v` command-line flags as a dict (a bare `--k` is "true")."""
    out, i = {}, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            k, eq, v = a[2:].partition("=")
            if not eq:
                if i + 1 < len(args) and not args[i + 1].startswith("--"):
                    v, i = args[i + 1], i + 1
                else:
                    v = "true"
            out[k] = v
        i += 1
    return out


def seconds(duration):
    """A Go duration such as 30s, 1m30s or 500ms, in seconds."""
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
    parts = re.findall(r"([0-9.]+)(h|ms|us|ns|m|s)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration: {duration}")
    return sum(float(n) * units[u] for n, u in parts)


def epp_version():
    """The EPP tag deploy/local builds: gwinstall.py's EPP_VERSION default."""
    m = re.search(r'EPP_VERSION\s*=\s*os\.environ\.get\("EPP_VERSION",\s*"([^"]+)"\)', (LOCAL / "gwinstall.py").read_text())
    if not m:
        raise ValueError("deploy/local/gwinstall.py: no EPP_VERSION default found")
    return m.group(1)


def rule_allows(rules, group, resource, verbs):
    """Whether RBAC rules grant all `verbs` on `resource` in API group `group`."""
    granted = set()
    for r in rules:
        if group in r.get("apiGroups", []) or "*" in r.get("apiGroups", []):
            if resource in r.get("resources", []) or "*" in r.get("resources", []):
                granted |= set(r.get("verbs", []))
    return "*" in granted or set(verbs) <= granted


# What the EPP reads through its ServiceAccount (llm-d-router v0.10.0's chart grants these).
EPP_NEEDS = [("", "pods"), ("inference.networking.k8s.io", "inferencepools"), ("llm-d.ai", "inferenceobjectives")]


def port_matches(target, container):
    """Whether a Service targetPort (name or number) is one of the container's ports."""
    for p in container.get("ports", []):
        if target == p.get("name") or target == p["containerPort"]:
            return p["containerPort"]
    return None


def check_epp(by_kind, errors):
    """Each InferencePool's endpoint picker: Service -> Deployment -> flags, config, RBAC."""
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}
    configmaps = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    epps = [d for d in by_kind.get("Deployment", []) if app_name(d) == EPP_LABEL]
    accounts = {a["metadata"]["name"] for a in by_kind.get("ServiceAccount", [])}
    roles = {r["metadata"]["name"]: r for r in by_kind.get("Role", [])}
    bindings = by_kind.get("RoleBinding", [])
    try:
        want_image = f"{EPP_IMAGE}:{epp_version()}"
    except ValueError as e:
        errors.append(str(e))
        want_image = None
    served = set()
    for pool in by_kind.get("InferencePool", []):
        pname = pool["metadata"]["name"]
        ref = pool["spec"].get("endpointPickerRef")
        if not ref:
            errors.append(f"InferencePool {pname}: no endpointPickerRef")
            continue
        if ref.get("kind", "Service") != "Service" or ref.get("group", "") != "":
            errors.append(f"InferencePool {pname}: endpointPickerRef is not a core Service")
            continue
        svc = services.get(ref["name"])
        if not svc:
            errors.append(f"InferencePool {pname}: endpointPickerRef names Service {ref['name']}, which is not defined")
            continue
        sport = next((p for p in svc["spec"].get("ports", []) if p["port"] == ref.get("port", {}).get("number")), None)
        if not sport:
            errors.append(f"InferencePool {pname}: Service {ref['name']} has no port {ref.get('port')}")
            continue
        sel = svc["spec"].get("selector", {})
        matched = [d for d in epps if sel and sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        if len(matched) != 1:
            errors.append(f"InferencePool {pname}: Service {ref['name']} selects {len(matched)} EPP Deployments, want 1")
            continue
        dep = matched[0]
        dname = dep["metadata"]["name"]
        served.add(dname)
        pod = dep["spec"]["template"]["spec"]
        c = next((c for c in pod["containers"] if c["name"] == "epp"), None)
        if c is None:
            errors.append(f"{dname}: no container named epp")
            continue
        f = flags(c.get("args", []))
        if want_image and c.get("image") != want_image:
            errors.append(f"{dname}: image {c.get('image')}, want {want_image} (deploy/local/gwinstall.py EPP_VERSION)")
        if f.get("pool-name") != pname:
            errors.append(f"{dname}: --pool-name {f.get('pool-name')}, want {pname} (the pool whose endpointPickerRef names it)")
        if f.get("pool-group", "inference.networking.k8s.io") != "inference.networking.k8s.io":
            errors.append(f"{dname}: --pool-group {f['pool-group']} is not the InferencePool's group")
        ns = f.get("pool-namespace")
        env = {e["name"]: e for e in c.get("env", [])}
        if ns is None:
            ns = "$(NAMESPACE)"  # the EPP falls back to $NAMESPACE
        m = re.fullmatch(r"\$\((\w+)\)", ns)
        if m and env.get(m.group(1), {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") != "metadata.namespace":
            errors.append(f"{dname}: pool namespace {ns} is not the pod's namespace (env {m.group(1)} from metadata.namespace)")
        grpc = port_matches(sport.get("targetPort", sport["port"]), c)
        if grpc is None or grpc != int(f.get("grpc-port", 9002)):
            errors.append(f"{dname}: Service {ref['name']} port {sport['port']} does not lead to --grpc-port {f.get('grpc-port', 9002)}")
        health = int(f.get("grpc-health-port", 9003))
        for probe in ("livenessProbe", "readinessProbe"):
            if c.get(probe, {}).get("grpc", {}).get("port") != health:
                errors.append(f"{dname}: {probe} is not gRPC on --grpc-health-port {health}")
        metrics = int(f.get("metrics-port", 9090))
        if port_matches(metrics, c) is None:
            errors.append(f"{dname}: metrics port {metrics} not declared")
        if dep["spec"].get("replicas", 1) > 1 and f.get("ha-enable-leader-election") != "true":
            errors.append(f"{dname}: several replicas without --ha-enable-leader-election")
        drain = seconds(f.get("drain-timeout", "30s"))
        if pod.get("terminationGracePeriodSeconds", 30) <= drain:
            errors.append(f"{dname}: grace {pod.get('terminationGracePeriodSeconds', 30)}s <= --drain-timeout {drain}s")
        if not pod.get("securityContext", {}).get("runAsNonRoot"):
            errors.append(f"{dname}: not runAsNonRoot")
        # --config-file must be a key of a ConfigMap mounted in the container.
        cfg_path = pathlib.PurePosixPath(f.get("config-file", ""))
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        cm_name = None
        for vm in c.get("volumeMounts", []):
            if cfg_path.parent == pathlib.PurePosixPath(vm["mountPath"]) and "configMap" in volumes.get(vm["name"], {}):
                cm_name = volumes[vm["name"]]["configMap"]["name"]
        cm = configmaps.get(cm_name)
        if not f.get("config-file") or cm is None or cfg_path.name not in cm.get("data", {}):
            errors.append(f"{dname}: --config-file {f.get('config-file')} is not a key of a mounted ConfigMap")
        else:
            check_epp_config(cm["data"][cfg_path.name], f"{dname}: ConfigMap {cm_name}", errors)
        # RBAC: its ServiceAccount, bound to a Role that reads what the EPP watches.
        sa = pod.get("serviceAccountName")
        if sa not in accounts:
            errors.append(f"{dname}: ServiceAccount {sa} is not defined")
            continue
        rules = []
        for b in bindings:
            if any(s["kind"] == "ServiceAccount" and s["name"] == sa and s.get("namespace") in (None, "") for s in b.get("subjects", [])):
                if b["roleRef"]["kind"] == "Role" and b["roleRef"]["name"] in roles:
                    rules += roles[b["roleRef"]["name"]].get("rules", [])
        for group, resource in EPP_NEEDS:
            if not rule_allows(rules, group, resource, ["get", "list", "watch"]):
                errors.append(f"{dname}: ServiceAccount {sa} may not get/list/watch {resource} ({group or 'core'})")
    for d in epps:
        if d["metadata"]["name"] not in served:
            errors.append(f"Deployment {d['metadata']['name']}: an EPP that no InferencePool's endpointPickerRef reaches")


# EndpointPickerConfig (llm-d.ai/v1alpha1, llm-d-router v0.10.0 apix/config/v1alpha1): the
# EPP decodes it strictly (unknown fields are errors); the nested sections it does not
# change here are only checked to be objects.
_OBJ = {"type": "object"}
EPC_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "plugins"],
    "properties": {
        "apiVersion": {"const": "llm-d.ai/v1alpha1"},
        "kind": {"const": "EndpointPickerConfig"},
        "featureGates": {"type": "array", "items": {"type": "string"}},
        "plugins": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["type"],
            "properties": {"name": {"type": "string"}, "type": {"type": "string", "minLength": 1}, "parameters": {}}}},
        "schedulingProfiles": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "plugins"],
            "properties": {"name": {"type": "string", "minLength": 1}, "plugins": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["pluginRef"],
                "properties": {"pluginRef": {"type": "string"}, "weight": {"type": "number"}}}}}}},
        "dataLayer": {"type": "object", "additionalProperties": False, "properties": {
            "injectDefaults": {"type": "boolean"},
            "sources": {"type": "array", "items": _OBJ},
            "discovery": {"type": "object", "additionalProperties": False, "required": ["pluginRef"],
                          "properties": {"pluginRef": {"type": "string"}}},
            "crossReplicaSyncerPluginRef": {"type": "string"},
            "crossReplicaSyncInterval": {"type": "string"}}},
        "flowControl": _OBJ,
        "requestHandler": _OBJ,
        "saturationDetector": {"type": "object", "additionalProperties": False,
                               "properties": {"pluginRef": {"type": "string"}}},
        "parser": _OBJ,
    },
}


def parse_epp_config(text):
    """Parses and validates an EndpointPickerConfig; returns it with plugin names filled
    in (an unnamed plugin is named by its type, as the EPP's loader does)."""
    cfg = yaml.safe_load(text)
    jsonschema.validate(cfg, EPC_SCHEMA)
    cfg = copy.deepcopy(cfg)
    names = []
    for p in cfg["plugins"]:
        p.setdefault("name", p["type"])
        names.append(p["name"])
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"plugin names defined twice: {sorted(dup)}")
    refs = [pl["pluginRef"] for prof in cfg.get("schedulingProfiles", []) for pl in prof["plugins"]]
    dl = cfg.get("dataLayer") or {}
    if dl.get("discovery"):
        refs.append(dl["discovery"]["pluginRef"])
    if (cfg.get("saturationDetector") or {}).get("pluginRef"):
        refs.append(cfg["saturationDetector"]["pluginRef"])
    missing = sorted(set(refs) - set(names))
    if missing:
        raise ValueError(f"pluginRef to undefined plugins: {missing}")
    return cfg


def without_discovery(cfg):
    """What the local config is on Kubernetes: no discovery plugin, no dataLayer.discovery."""
    cfg = copy.deepcopy(cfg)
    dl = cfg.get("dataLayer") or {}
    disc = dl.pop("discovery", None)
    if disc:
        cfg["plugins"] = [p for p in cfg["plugins"] if p["name"] != disc["pluginRef"]]
    if "dataLayer" in cfg and not dl:
        del cfg["dataLayer"]
    return cfg


def local_epp_config():
    """deploy/local/epp-config.yaml with its placeholders filled as gateway.py does."""
    text = re.sub(r"\$\{(\w+)\}", "/run/endpoints.yaml", (LOCAL / "epp-config.yaml").read_text())
    return parse_epp_config(text)


def check_epp_config(text, where, errors, local=None):
    """The Kubernetes EndpointPickerConfig: valid, no file discovery, and the local one's
    scheduling (plugins with their parameters, profiles with their weights)."""
    try:
        cfg = parse_epp_config(text)
        local = local or local_epp_config()
    except Exception as e:
        errors.append(f"{where}: not a valid EndpointPickerConfig: {str(e).splitlines()[0]}")
        return
    if (cfg.get("dataLayer") or {}).get("discovery") or any(p["type"].endswith("-discovery") for p in cfg["plugins"]):
        errors.append(f"{where}: configures discovery; on Kubernetes the EPP discovers the InferencePool's pods")
    want = without_discovery(local)
    for part in sorted(set(want) | set(cfg)):
        if cfg.get(part) != want.get(part):
            errors.append(f"{where}: {part} differ from deploy/local/epp-config.yaml: {cfg.get(part)} != {want.get(part)}")
    if not any(p["type"] == "file-discovery" for p in local["plugins"]):
        errors.append("deploy/local/epp-config.yaml: no file-discovery plugin (the local stack needs one)")


def check_generated(errors):
    """deploy/kubernetes/epp-config.yaml is what gen-epp-config.py makes of the local one."""
    spec = importlib.util.spec_from_file_location("gen_epp_config", KDIR / "gen-epp-config.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    try:
        if gen.TARGET.read_text() != gen.generate(gen.SOURCE.read_text()):
            errors.append("deploy/kubernetes/epp-config.yaml is stale: run deploy/kubernetes/gen-epp-config.py")
    except ValueError as e:
        errors.append(f"gen-epp-config.py: {e}")


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
    for what, breaks in CONTRACT_BREAKS:
        bad = copy.deepcopy(docs)
        breaks(bad)
        found = []
        check_contract(bad, found)
        if not found:
            errors.append(f"self-check: {what} passed the contract check")


def _find(docs, kind, name=None):
    return next(d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"].startswith(name)))


def _set_weight(docs):
    cm = _find(docs, "ConfigMap", "sloserve-epp-config")
    cm["data"]["epp-config.yaml"] = cm["data"]["epp-config.yaml"].replace("weight: 3", "weight: 1")


def _add_discovery(docs):
    cm = _find(docs, "ConfigMap", "sloserve-epp-config")
    cm["data"]["epp-config.yaml"] += "dataLayer:\n  discovery:\n    pluginRef: queue-scorer\n"


def _drop_pods_rule(docs):
    role = _find(docs, "Role")
    role["rules"] = [r for r in role["rules"] if "pods" not in r["resources"]]


def _wrong_pool(docs):
    dep = next(d for d in docs if d["kind"] == "Deployment" and app_name(d) == EPP_LABEL)
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["args"] = [a.replace("--pool-name=", "--pool-name=other-") for a in c["args"]]


# Each must make check_contract fail (step 6).
CONTRACT_BREAKS = [
    ("an InferencePool whose endpointPickerRef names a missing Service",
     lambda docs: _find(docs, "InferencePool")["spec"]["endpointPickerRef"].update(name="no-such-epp")),
    ("an endpointPickerRef to a port the EPP Service lacks",
     lambda docs: _find(docs, "InferencePool")["spec"]["endpointPickerRef"].update(port={"number": 9003})),
    ("an EPP for another pool", _wrong_pool),
    ("an EPP config with another prefix-cache-scorer weight", _set_weight),
    ("an EPP config with file discovery", _add_discovery),
    ("an EPP Role without pods", _drop_pods_rule),
    ("an EPP image not at gwinstall.py's version",
     lambda docs: next(c for d in docs if d["kind"] == "Deployment" and app_name(d) == EPP_LABEL
                       for c in d["spec"]["template"]["spec"]["containers"]).update(image=EPP_IMAGE + ":v0.0.1")),
]


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
    check_generated(errors)
    if args.bin:
        check_configs(args.bin, errors)
    self_check(docs, errors)
    for e in errors:
        print(f"FAIL {e}", file=sys.stderr)
    # Checks: each object's schema, each object's broken copy, the contract (EPPs included),
    # the generated EPP config, each contract break, the configs.
    checks = 2 * len(docs) + 2 + len(CONTRACT_BREAKS) + (1 if args.bin else 0)
    failed = min(len(errors), checks)
    print(f"{checks - failed} passed, {failed} failed")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
