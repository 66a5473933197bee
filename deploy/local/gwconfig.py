"""The gateway's files, rendered from deploy/local's templates into a run folder, and
the readiness watcher that keeps the EPP's discovery file to the replicas that answer
/ready (the part a kubelet's readiness probe plays for an InferencePool).
"""

import json
import os
import re
import signal
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def render(template, values):
    """`template` (a path, or a name in deploy/local) with `${NAME}` replaced from `values`. A value that is a list of lines replaces a
    placeholder standing alone on its line, each line at the placeholder's indent."""
    out = []
    with open(os.path.join(HERE, template)) as f:  # an absolute `template` stays as is
        for line in f:
            m = re.fullmatch(r"(\s*)\$\{(\w+)\}\s*", line)
            if m and isinstance(values.get(m.group(2)), list):
                out += [m.group(1) + item + "\n" for item in values[m.group(2)]]
                continue
            out.append(re.sub(r"\$\{(\w+)\}", lambda k: str(values[k.group(1)]), line))
    return "".join(out)


def write_atomic(path, text):
    """Write to a temporary file and rename it over `path` (the EPP's fsnotify watch
    sees one Create, never a half-written file)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def endpoints_yaml(replicas):
    """The file-discovery plugin's file: one entry per replica (name, IPv4, port)."""
    lines = ["# Written by deploy/local/gateway.py: the replicas now answering /ready.", "endpoints:"]
    if not replicas:
        return "\n".join(lines[:1] + ["endpoints: []"]) + "\n"
    for r in replicas:
        lines += [
            f"  - name: {r['name']}",
            '    address: "127.0.0.1"',
            f"    port: \"{r['port']}\"",
            "    labels:",
            f"      sloserve.dev/role: {r['role']}",
        ]
    return "\n".join(lines) + "\n"


def envoy_lb_endpoints(replicas):
    """Envoy `lb_endpoints` items for a STATIC cluster, as flow-style YAML lines."""
    return [
        "- endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %d}}}" % r["port"]
        for r in replicas
    ] or ["[]"]


def render_all(stack):
    """Every file the stack's processes read, into the run folder."""
    run = stack["run_dir"]
    ports = stack["ports"]
    values = {
        "ENVOY_PORT": ports["envoy"],
        "ENVOY_ADMIN_PORT": ports["envoy_admin"],
        "EPP_GRPC_PORT": ports["epp_grpc"],
        "LOG_DIR": stack["log_dir"],
        "ENDPOINTS_FILE": os.path.join(run, "endpoints.yaml"),
        "MODEL": stack["model"],
        "RENDER_URL": f"http://127.0.0.1:{stack['replicas'][0]['port']}",
        "KV_EVENTS_ENDPOINT": kv_events_endpoint(stack),
        "LB_POLICY": stack.get("lb_policy", "LEAST_REQUEST"),
    }
    reps = stack["replicas"]
    if stack["mode"] == "epp":
        write_atomic(os.path.join(run, "endpoints.yaml"), endpoints_yaml(reps))
        write_atomic(os.path.join(run, "epp-config.yaml"), render(template_path(stack.get("epp_config", "approximate")), values))
        write_atomic(os.path.join(run, "envoy.yaml"), render("envoy-epp.yaml", values))
    else:
        batch = [r for r in reps if r["role"] == "batch"]
        values.update(
            ALL_ENDPOINTS=envoy_lb_endpoints(reps),
            BATCH_ENDPOINTS=envoy_lb_endpoints(batch),
            OTHER_ENDPOINTS=envoy_lb_endpoints([r for r in reps if r not in batch]),
        )
        write_atomic(os.path.join(run, "envoy.yaml"), render("envoy-direct.yaml", values))


def template_path(name):
    """An EPP config template: a path, or the name of one in deploy/local
    (`approximate` is epp-config.yaml, `precise` is epp-config-precise.yaml)."""
    presets = {"approximate": "epp-config.yaml", "precise": "epp-config-precise.yaml"}
    return os.path.join(HERE, presets.get(name, name))


def wants_kv_events(template):
    """A template that names ${KV_EVENTS_ENDPOINT} gets the replicas' KV-cache events there."""
    with open(template_path(template)) as f:
        return "${KV_EVENTS_ENDPOINT}" in f.read()


def kv_events_endpoint(stack):
    """Where the EPP binds its KV-events SUB socket and each replica's PUB connects."""
    return f"tcp://127.0.0.1:{stack['ports']['kv_events']}"


def is_ready(port, timeout=0.5):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=timeout) as r:
            return r.status == 200
    except Exception:
        return False


def watch(run_dir, interval=0.25):
    """Polls each replica's /ready every `interval` s; when the set of ready replicas
    changes, rewrites endpoints.yaml (the EPP reloads it). Runs until SIGTERM."""
    with open(os.path.join(run_dir, "stack.json")) as f:
        stack = json.load(f)
    path = os.path.join(run_dir, "endpoints.yaml")
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    current = [r["name"] for r in stack["replicas"]]
    # A replica must miss two probes in a row to leave (one slow answer on a loaded
    # machine is not a death) and pass one to come back.
    misses = {r["name"]: 0 for r in stack["replicas"]}
    while not stop:
        for r in stack["replicas"]:
            misses[r["name"]] = 0 if is_ready(r["port"]) else misses[r["name"]] + 1
        ready = [r for r in stack["replicas"] if misses[r["name"]] < 2]
        names = [r["name"] for r in ready]
        if names != current:
            write_atomic(path, endpoints_yaml(ready))
            print(f"{time.time():.3f} endpoints: {current} -> {names}", flush=True)
            current = names
        time.sleep(interval)
    return 0


if __name__ == "__main__":
    sys.exit(watch(sys.argv[1]))
