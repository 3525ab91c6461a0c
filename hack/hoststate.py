#!/usr/bin/env python3
"""What a real kubelet node changes on this machine, recorded before it starts and put back after it stops.

Contract (standard library only, like hack/localcluster.py; needs root to restore):

- ``snapshot()`` reads the host state a kubelet, kube-proxy, containerd and the CNI bridge plugin change: the
  sysctls in ``SYSCTLS`` (the kubelet sets vm.overcommit_memory, kernel.panic, kernel.panic_on_oops and the key
  quotas; kube-proxy the conntrack limits and route_localnet; the bridge plugin ip_forward), the iptables and
  ip6tables chains of every table, and the network namespaces in /run/netns. It returns a JSON-able dict.
- ``restore(before, scope)`` undoes the difference: it kills what still runs in ``scope`` (processes whose
  command line names one of its paths, and everything in its cgroups), unmounts what is mounted under its paths
  (deepest first) and the network namespaces made since ``before``, removes its cgroups and its bridge, deletes
  the iptables chains made since ``before`` together with every rule that jumps to them or names the pod network,
  sets the sysctls back and removes its directories (only once nothing is mounted under them). Each step is tried
  whatever the others do; it returns the errors met.
- ``leftovers(before, scope)`` lists, in words, whatever of ``scope`` is still there and every recorded sysctl or
  chain that differs from ``before``: empty when the machine is as it was. ``down`` fails when it is not.

A ``Scope`` names what belongs to one node: its directories (state, mounts, sockets), its cgroup name (the
kubelet's cgroupRoot, under every hierarchy), its bridge, its pod network. Nothing outside a scope is touched
except the sysctls and chains that did not exist or differed before, so other clusters on the machine (which run
no kubelet: their nodes are simulated) and Docker's own chains are left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# sysctl name -> /proc/sys path. Written by: the kubelet (vm.*, kernel.*), kube-proxy (route_localnet, conntrack),
# the CNI bridge plugin with isGateway (ip_forward).
SYSCTLS = (
    "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
    "net.ipv4.conf.all.route_localnet", "net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding",
    "net.netfilter.nf_conntrack_max", "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait", "net.bridge.bridge-nf-call-iptables",
)
TABLES = ("filter", "nat", "mangle", "raw")
NETNS_DIR = Path("/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class Scope:
    """What belongs to one real node. ``paths``: directories it owns (everything under them is its own);
    ``cgroup``: the kubelet's cgroupRoot without the leading slash; ``bridge``: the CNI bridge's name;
    ``pod_cidr``: the pod network, as iptables prints it (``10.250.0.0/24``)."""

    paths: tuple[str, ...]
    cgroup: str
    bridge: str
    pod_cidr: str


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            values[name] = sysctl_path(name).read_text().strip()
    return values


# ---------------------------------------------------------------------------------------------- iptables


def iptables_commands() -> tuple[str, ...]:
    """The iptables front ends of this machine (IPv4 always, IPv6 when its tools run)."""
    found = []
    for command in ("iptables", "ip6tables"):
        with contextlib.suppress(OSError):
            if subprocess.run([command, "-w", "-S", "-t", "filter"], capture_output=True, timeout=30).returncode == 0:
                found.append(command)
    return tuple(found)


def iptables_rules(command: str, table: str) -> list[str]:
    """``iptables -S`` of one table: "-N CHAIN", "-P CHAIN POLICY" and "-A CHAIN ..." lines."""
    proc = subprocess.run([command, "-w", "-t", table, "-S"], capture_output=True, text=True, timeout=30)
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def chains_of(rules: Iterable[str]) -> set[str]:
    return {line.split()[1] for line in rules if line.startswith(("-N ", "-P "))}


def jumps_to(rule: str, chains: set[str]) -> bool:
    words = rule.split()
    return any(w in ("-j", "-g") and i + 1 < len(words) and words[i + 1] in chains for i, w in enumerate(words))


def names_network(rule: str, scope: Scope) -> bool:
    return scope.pod_cidr in rule.split() or f'"{scope.bridge}"' in rule or f" {scope.bridge} " in f" {rule} "


def iptables_chains() -> dict[str, dict[str, list[str]]]:
    return {command: {table: sorted(chains_of(iptables_rules(command, table))) for table in TABLES}
            for command in iptables_commands()}


def remove_chains(before: dict[str, dict[str, list[str]]], scope: Scope) -> list[str]:
    """Delete every chain made since ``before`` with the rules that jump to it, and every rule naming the node's
    pod network or bridge. Rules are deleted by their ``-S`` spelling (``-A`` turned into ``-D``)."""
    errors = []
    for command in iptables_commands():
        for table in TABLES:
            rules = iptables_rules(command, table)
            new = chains_of(rules) - set(before.get(command, {}).get(table, []))
            for rule in rules:
                if rule.startswith("-A ") and (jumps_to(rule, new) or names_network(rule, scope)):
                    argv = [command, "-w", "-t", table, "-D", *_split_rule(rule[3:])]
                    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
                    if proc.returncode != 0 and rule.split()[1] not in new:
                        errors.append(f"{command} -t {table} -D {rule[3:]}: {proc.stderr.strip()}")
            for chain in sorted(new):
                subprocess.run([command, "-w", "-t", table, "-F", chain], capture_output=True, timeout=30)
            for chain in sorted(new):
                proc = subprocess.run([command, "-w", "-t", table, "-X", chain], capture_output=True, text=True,
                                      timeout=30)
                if proc.returncode != 0:
                    errors.append(f"{command} -t {table} -X {chain}: {proc.stderr.strip()}")
    return errors


def _split_rule(text: str) -> list[str]:
    """Split an ``iptables -S`` rule into arguments: words, with double-quoted comments kept whole."""
    return [m.group(1) if m.group(1) is not None else m.group(2)
            for m in re.finditer(r'"((?:[^"\\]|\\.)*)"|(\S+)', text)]


# ---------------------------------------------------------------------------------------------- mounts, cgroups


def mounts() -> list[str]:
    """Mount points of this mount namespace, in /proc/self/mountinfo order (octal escapes decoded)."""
    points = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4:
                points.append(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    return points


def under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def cgroup_dirs(scope: Scope) -> list[Path]:
    """The node's cgroup directory under each mounted hierarchy (cgroup v1: one per controller; v2: one)."""
    candidates = [CGROUP_ROOT / scope.cgroup]
    with contextlib.suppress(OSError):
        candidates += [d / scope.cgroup for d in CGROUP_ROOT.iterdir() if d.is_dir() and not d.is_symlink()]
    return [c for c in candidates if c.is_dir()]


def cgroup_pids(scope: Scope) -> set[int]:
    pids: set[int] = set()
    for top in cgroup_dirs(scope):
        for procs in top.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(p) for p in procs.read_text().split())
    return pids


def names_scope(cmdline: str, scope: Scope) -> bool:
    """Whether a command line names one of the scope's paths, as a whole path (not a longer name it begins)."""
    return any(re.search(rf"{re.escape(p.rstrip('/'))}(?=[/\s=:\"]|$)", cmdline) for p in scope.paths)


def scope_pids(scope: Scope) -> set[int]:
    """Processes of the node: in its cgroups, or with one of its paths on their command line (containerd, its
    shims, the kubelet, kube-proxy), never this process."""
    pids = cgroup_pids(scope)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if names_scope(cmdline, scope):
                pids.add(int(proc.name))
    pids.discard(os.getpid())
    return pids


def kill_all(pids: Iterable[int], timeout: float = 10) -> None:
    pending = set(pids)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pending:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            pending = {p for p in pending if Path(f"/proc/{p}").exists() and not _zombie(p)}
            time.sleep(0.1)
        if not pending:
            return


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


# ---------------------------------------------------------------------------------------------- the contract


def snapshot() -> dict[str, Any]:
    netns = sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []
    return {"sysctls": read_sysctls(), "iptables": iptables_chains(), "netns": netns,
            "netns_dir": NETNS_DIR.is_dir()}


def new_netns(before: dict[str, Any]) -> list[Path]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p for p in NETNS_DIR.iterdir() if p.name not in set(before.get("netns", [])))


def restore(before: dict[str, Any], scope: Scope) -> list[str]:
    errors: list[str] = []

    def attempt(what: str, action: Any) -> None:
        try:
            action()
        except (OSError, subprocess.SubprocessError) as err:
            errors.append(f"{what}: {err}")

    attempt("stopping the node's processes", lambda: kill_all(scope_pids(scope)))
    # Deepest first: a mount under another must go before it.
    for point in sorted((m for m in mounts() if under(m, scope.paths)), key=len, reverse=True):
        attempt(f"unmounting {point}", lambda point=point: _umount(point))
    for ns in new_netns(before):
        attempt(f"removing network namespace {ns}", lambda ns=ns: (_umount(str(ns)), ns.unlink()))
    if not before.get("netns_dir", True) and NETNS_DIR.is_dir() and not any(NETNS_DIR.iterdir()):
        attempt(f"removing {NETNS_DIR}", NETNS_DIR.rmdir)  # containerd made it
    for top in cgroup_dirs(scope):
        # Children before parents: a cgroup directory is removed only once it has none.
        nested = sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: len(d.parts), reverse=True)
        for directory in [*nested, top]:
            attempt(f"removing cgroup {directory}", lambda d=directory: d.rmdir())
    if Path(f"/sys/class/net/{scope.bridge}").exists():
        attempt(f"deleting bridge {scope.bridge}",
                lambda: subprocess.run(["ip", "link", "delete", scope.bridge], check=True, capture_output=True))
    errors += remove_chains(before.get("iptables", {}), scope)
    for name, value in before.get("sysctls", {}).items():
        if read_sysctls().get(name) != value:
            attempt(f"setting {name} back to {value}", lambda n=name, v=value: sysctl_path(n).write_text(v))
    remaining = [m for m in mounts() if under(m, scope.paths)]
    for path in scope.paths:
        # Never while something is mounted under it: a container's bind mount of a host directory would be
        # emptied through it.
        if remaining:
            errors.append(f"not removing {path}: still mounted under it: {', '.join(remaining)}")
        elif Path(path).exists():
            attempt(f"removing {path}", lambda path=path: shutil.rmtree(path))
    return errors


def _umount(point: str) -> None:
    if subprocess.run(["umount", point], capture_output=True).returncode != 0:
        # Busy (a process that has not exited yet holds it): detach it now; the kernel frees it when unused.
        subprocess.run(["umount", "-l", point], check=True, capture_output=True)


def leftovers(before: dict[str, Any], scope: Scope) -> list[str]:
    found = []
    pids = scope_pids(scope)
    if pids:
        found.append(f"processes still running: {', '.join(_describe(p) for p in sorted(pids))}")
    points = [m for m in mounts() if under(m, scope.paths)]
    if points:
        found.append(f"mounts: {', '.join(points)}")
    netns = new_netns(before)
    if netns:
        found.append(f"network namespaces: {', '.join(str(n) for n in netns)}")
    elif not before.get("netns_dir", True) and NETNS_DIR.is_dir():
        found.append(f"the directory {NETNS_DIR}")
    cgroups = cgroup_dirs(scope)
    if cgroups:
        found.append(f"cgroups: {', '.join(str(c) for c in cgroups)}")
    if Path(f"/sys/class/net/{scope.bridge}").exists():
        found.append(f"the bridge {scope.bridge}")
    now = iptables_chains()
    for command, tables in now.items():
        for table, chains in tables.items():
            extra = set(chains) - set(before.get("iptables", {}).get(command, {}).get(table, []))
            if extra:
                found.append(f"{command} chains in {table}: {', '.join(sorted(extra))}")
            stray = [r for r in iptables_rules(command, table) if r.startswith("-A ") and names_network(r, scope)]
            if stray:
                found.append(f"{command} rules in {table} naming the pod network: {'; '.join(stray)}")
    current = read_sysctls()
    for name, value in before.get("sysctls", {}).items():
        if current.get(name) != value:
            found.append(f"sysctl {name} is {current.get(name)} (was {value})")
    existing = [p for p in scope.paths if Path(p).exists()]
    if existing:
        found.append(f"directories: {', '.join(existing)}")
    return found


def _describe(pid: int) -> str:
    try:
        name = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        name = "?"
    return f"{pid} ({name})"
