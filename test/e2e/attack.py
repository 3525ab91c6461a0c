"""An unauthenticated client's load on the controller's ports, light on CPU (one asyncio loop), for
test_serving_attack: idle TLS connections to the webhook port, slow-byte connections (one byte every few seconds)
to the webhook and the HTTP ports, and concurrent oversized forged AdmissionReviews, repeated. Each kind
reconnects when the server closes it, so the pressure holds for the whole run.

``python -m test.e2e.attack --webhook HOST:PORT --http HOST:PORT --seconds 60`` prints "ready" once every idle
connection is open, then at the end one JSON line of counts. ``launched`` runs it so as a child process (the e2e test
and the bench's admission_attack), ``ready`` and ``counts`` read what it prints.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def launched(args: list[str], *, cwd: Path, stderr: IO[bytes] | None = None) -> Iterator[subprocess.Popen[str]]:
    """This module run as a child process with ``args``; killed on the way out if it still runs."""
    proc = subprocess.Popen([sys.executable, "-m", "test.e2e.attack", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=stderr, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def ready(proc: subprocess.Popen[str]) -> bool:
    """Whether the child opened every idle connection (its first line)."""
    assert proc.stdout is not None
    return proc.stdout.readline().strip() == "ready"


def counts(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The child's counts, once its run ends (its last line)."""
    return dict(json.loads(proc.communicate(timeout=120)[0].strip().splitlines()[-1]))

def forged_review(size: int) -> bytes:
    """An AdmissionReview of about ``size`` bytes, valid JSON made of many small objects (what costs most memory
    to parse), claiming to come from a cluster admin."""
    filler_item = {"name": "x" * 8, "value": 12345}
    per_item = len(json.dumps(filler_item, separators=(",", ":"))) + 1
    review: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "forged-0000", "kind": {"group": "workload.codeflare.dev", "version": "v1beta1",
                                                   "kind": "AppWrapper"},
                    "operation": "CREATE", "namespace": "default", "name": "forged",
                    "userInfo": {"username": "system:admin", "groups": ["system:masters"]},
                    "object": {"apiVersion": "workload.codeflare.dev/v1beta1", "kind": "AppWrapper",
                               "metadata": {"name": "forged", "namespace": "default"},
                               "spec": {"filler": [filler_item] * (size // per_item)}}}}
    return json.dumps(review, separators=(",", ":")).encode()


def _client_tls() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Attack:
    def __init__(self, webhook: tuple[str, int], http: tuple[str, int], seconds: float) -> None:
        self.webhook = webhook
        self.http = http
        self.seconds = seconds
        self.until = time.monotonic() + 3600  # until the idle connections are open; then ``seconds`` more
        self.tls = _client_tls()
        self.counts: Counter[str] = Counter()

    def running(self) -> bool:
        return time.monotonic() < self.until

    async def idle(self, opened: asyncio.Event, total: int, done: list[int]) -> None:
        """A TLS connection that sends nothing; reopened when the server closes it."""
        first = True
        while self.running():
            try:
                reader, writer = await asyncio.open_connection(*self.webhook, ssl=self.tls)
            except OSError:
                self.counts["idle_connect_failed"] += 1
                await asyncio.sleep(1)
                continue
            if first:
                first = False
                done[0] += 1
                if done[0] == total:
                    opened.set()
            else:
                self.counts["idle_reopened"] += 1
            with contextlib.suppress(TimeoutError, OSError):
                while self.running():  # ``until`` moves once every idle connection is open
                    try:
                        if await asyncio.wait_for(reader.read(1), timeout=1.0) == b"":
                            break  # closed by the server
                    except TimeoutError:
                        continue
            writer.close()

    async def slow(self, address: tuple[str, int], tls: bool, every: float) -> None:
        """One byte of a request head every ``every`` seconds; reconnects when cut off."""
        head = b"POST /validate HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 10_000
        kind = "slow_webhook" if tls else "slow_http"
        while self.running():
            try:
                reader, writer = await asyncio.open_connection(*address, ssl=self.tls if tls else None)
                for byte in head:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    try:
                        if await asyncio.wait_for(reader.read(1), timeout=every) == b"":
                            break  # closed by the server
                    except TimeoutError:
                        pass
                    if not self.running():
                        break
                self.counts[f"{kind}_cut_off"] += 1
                writer.close()
            except OSError:
                self.counts[f"{kind}_errors"] += 1
                await asyncio.sleep(0.5)

    async def big(self, body: bytes) -> None:
        """Forged reviews one after the other on one connection (a new one when closed)."""
        request = (f"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode()
        while self.running():
            try:
                reader, writer = await asyncio.open_connection(*self.webhook, ssl=self.tls)
                while self.running():
                    writer.write(request)
                    writer.write(body)
                    await writer.drain()
                    status_line = await asyncio.wait_for(reader.readline(), timeout=30)
                    if not status_line:
                        break
                    status = status_line.split(b" ")[1].decode()
                    length = 0
                    while (line := await reader.readline()) not in (b"\r\n", b""):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    await reader.readexactly(length)
                    self.counts[f"big_{status}"] += 1
                writer.close()
            except (OSError, TimeoutError, asyncio.IncompleteReadError, IndexError):
                self.counts["big_errors"] += 1
                await asyncio.sleep(0.2)

    async def run(self, idle: int, slow: int, big: int, big_bytes: int, slow_every: float) -> None:
        opened = asyncio.Event()
        if idle == 0:
            opened.set()
        done = [0]
        tasks = []
        for i in range(idle):
            tasks.append(asyncio.create_task(self.idle(opened, idle, done)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)  # spread the handshakes a little
        await asyncio.wait_for(opened.wait(), timeout=120)
        self.until = time.monotonic() + self.seconds
        print("ready", flush=True)
        for _ in range(slow):
            tasks.append(asyncio.create_task(self.slow(self.webhook, True, slow_every)))
            tasks.append(asyncio.create_task(self.slow(self.http, False, slow_every)))
        body = forged_review(big_bytes)
        self.counts["big_body_bytes"] = len(body)
        for _ in range(big):
            tasks.append(asyncio.create_task(self.big(body)))
        await asyncio.gather(*tasks, return_exceptions=True)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--webhook", required=True)
    parser.add_argument("--http", required=True)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--idle", type=int, default=500)
    parser.add_argument("--slow", type=int, default=64)
    parser.add_argument("--slow-every", type=float, default=5)
    parser.add_argument("--big", type=int, default=16)
    parser.add_argument("--big-bytes", type=int, default=5_000_000)
    args = parser.parse_args()
    attack = Attack(_address(args.webhook), _address(args.http), args.seconds)
    asyncio.run(attack.run(args.idle, args.slow, args.big, args.big_bytes, args.slow_every))
    print(json.dumps(dict(attack.counts)), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
