"""Helpers shared by the tests: polling with a deadline (never a bare sleep), freezing a process, and loading
hack/ modules."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socketserver
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_until(check: Callable[[], T | None], timeout: float = 30.0, what: str = "condition") -> T:
    """Call ``check`` until it returns something truthy and return that; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last value: {last!r})")


def _all_threads_stopped(pid: int) -> bool:
    """Every thread of ``pid`` is in state T (stopped), per /proc/<pid>/task/*/stat."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        with contextlib.suppress(OSError):  # a thread that exited between the glob and the read
            # The state follows the command name, which is in parentheses and may itself hold spaces.
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
    return bool(states) and all(state in ("T", "t") for state in states)


@contextlib.contextmanager
def frozen_process(pid: int, timeout: float = 10.0) -> Iterator[None]:
    """SIGSTOP ``pid`` for the block and SIGCONT it afterwards, whatever happens. The block starts only once
    every thread has stopped: kill() returns before a busy thread on another core has taken the signal, and a
    request sent in that window is still answered (seen once in CI)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_until(lambda: _all_threads_stopped(pid), timeout=timeout, what=f"every thread of pid {pid} to stop")
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


# Nothing listens on port 9 (discard) of loopback: a connection there is refused at once, no cluster needed.
UNREACHABLE_SERVER = "https://127.0.0.1:9"


@contextlib.contextmanager
def serving(server: socketserver.BaseServer, path: str = "") -> Iterator[str]:
    """``server`` (bound to 127.0.0.1) served on a thread of its own; yields its URL (plus ``path``); shut and
    closed on the way out."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}{path}"
    finally:
        server.shutdown()
        server.server_close()


def unreachable_kubeconfig(directory: Path) -> Path:
    """A kubeconfig whose API server refuses every connection at once."""
    return placeholder_kubeconfig(directory, UNREACHABLE_SERVER)


def placeholder_kubeconfig(directory: Path, server: str) -> Path:
    """A kubeconfig for ``server`` with a placeholder bearer token (``directory``/kubeconfig)."""
    path = directory / "kubeconfig"
    path.write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    return path


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    """Each path (relative to ``root``) written with its text, folders made as needed: a synthetic tree for the
    tests that read a source or docs tree. Returns ``root``."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def load_hack_module(name: str) -> ModuleType:
    """Import hack/<name>.py (hack/ is scripts, not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "hack" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def free_port(host: str = "127.0.0.1") -> int:
    """A port for a server a test starts and names: below the kernel's ephemeral range, so no other process's
    bind(0) or outgoing connection takes it between this probe and the server's bind, and apart from the ports
    clusters name at ``up`` (hack/localcluster.py ``reserved_port``)."""
    return int(load_hack_module("localcluster").reserved_port(host))


def compact_local_etcd(kubeconfig: str) -> bool:
    """Compact the etcd of the hack/localcluster.py cluster behind ``kubeconfig`` to its current revision.

    Makes every older resourceVersion expire at once (the API server itself compacts only every 5 minutes), so a
    test can provoke 410 Gone on a fresh cluster. Returns False when ``kubeconfig`` is not a local cluster's.
    """
    import base64
    import json
    import urllib.request

    path = Path(kubeconfig).resolve()
    if path.parent != REPO / ".dev" or not path.name.startswith("kubeconfig"):
        return False
    name = path.name.removeprefix("kubeconfig").removeprefix("-") or "mcad"
    try:
        port = json.loads((REPO / ".dev" / "clusters" / name / "state.json").read_text())["ports"]["etcd"]
    except (OSError, ValueError, KeyError):
        return False

    def post(endpoint: str, body: dict[str, object]) -> dict[str, object]:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v3/{endpoint}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]

    header = post("kv/range", {"key": base64.b64encode(b"/").decode()})["header"]
    post("kv/compaction", {"revision": header["revision"], "physical": True})  # type: ignore[index]
    return True


def token_kubeconfig(admin_kubeconfig: str, token: str, path: Path, *, user: str = "sa",
                     namespace: str = "") -> str:
    """Write a kubeconfig for the API server of ``admin_kubeconfig``'s current context that carries only ``token``
    (as user ``user``, default namespace ``namespace``), readable by its owner alone; return its path."""
    import yaml  # test-only dependency, kept out of the import of every test module

    config = yaml.safe_load(Path(admin_kubeconfig).read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
    own_context = {"cluster": "local", "user": user, **({"namespace": namespace} if namespace else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": user,
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": own_context}]}))
    path.chmod(0o600)
    return str(path)
