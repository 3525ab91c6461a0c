"""The do-nothing admission webhook of the bench's floor figure (``--webhook-server null`` / ``null-http2``).

With the webhooks on, throughput pays for the API server's own admission work (the creator policy, the calls it
makes) and for the webhook server that answers. This server does nothing but answer: Go's net/http,
every review allowed; HTTP/1.1, as an installation's API server calls a webhook behind a Service, or HTTP/2 offered
too (which the API server takes only for a webhook addressed by URL, as the bench registers it). Run in mcad's
place, the on/off ratio it gives is close to the best any webhook implementation could reach on the same machine
and load: the floor that the API server sets, against which mcad's own figure is read. The Go source is
``test/perf/go/nullwebhook`` (its contract is in its header).

Contract:
- ``build()``: the server's binary, built with the go tool (standard library only, nothing downloaded) once per
  source into ``$MCAD_DEV_CACHE/nullwebhook-<hash of the source>/nullwebhook`` (``harness.dev_cache``); written
  under a temporary name and renamed, so an interrupted build is never taken for a built one. ``NullWebhookError``
  without go, or when the build fails or takes over ``BUILD_TIMEOUT``.
- ``NullWebhook(http2=False)``: ``start()`` issues a CA and a serving certificate for 127.0.0.1 (mcad's own
  ``certs.issue``), starts the server on a free port of 127.0.0.1 and waits until it answers ``/stats``
  (``BenchError`` after 10 s; ``NullWebhookError`` if it exits; stopped either way); ``ca_bundle`` is the CA to
  put in the webhook configurations, ``port`` where they call. ``stats()``: requests answered and connections
  accepted so far; ``cpu_seconds()``: the process's CPU so far. ``stop()`` kills it; the object is a context
  manager that stops it on exit.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType

from test.perf.harness import dev_cache, proc_stats, wait_for
from test.perf.webhooks import HOST, free_port
from test.support import REPO

SOURCE = REPO / "test" / "perf" / "go" / "nullwebhook"
START_TIMEOUT = 10.0
# The standard library only, nothing to download: seconds with Go's build cache warm, well under a minute cold.
BUILD_TIMEOUT = 600.0


class NullWebhookError(RuntimeError):
    pass


def source_key() -> str:
    """A hash of the Go source: a changed server is built anew, never taken from an older cache entry."""
    digest = hashlib.sha256()
    for path in sorted(SOURCE.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def build() -> Path:
    binary = dev_cache() / f"nullwebhook-{source_key()}" / "nullwebhook"
    if os.access(binary, os.X_OK):
        return binary
    go = shutil.which("go")
    if go is None:
        raise NullWebhookError("the null webhook is built with Go: 'go' is not on PATH")
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name("nullwebhook.partial")
    try:
        proc = subprocess.run([go, "build", "-o", str(partial), "."], cwd=SOURCE, capture_output=True, text=True,
                              env={**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-buildvcs=false"},
                              timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as err:
        raise NullWebhookError(f"go build of {SOURCE} took over {BUILD_TIMEOUT:g} s") from err
    if proc.returncode != 0:
        raise NullWebhookError(f"go build of {SOURCE} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    partial.rename(binary)
    return binary


class NullWebhook:
    def __init__(self, *, http2: bool = False) -> None:
        self.http2 = http2
        self.port = 0
        self.ca_bundle = b""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._log = Path()

    def start(self) -> NullWebhook:
        from mcad.admission import certs

        binary = build()
        material = certs.issue([HOST], datetime.datetime.now(datetime.UTC))
        self._dir = tempfile.TemporaryDirectory(prefix="mcad-nullwebhook-")
        cert, key = Path(self._dir.name) / "tls.crt", Path(self._dir.name) / "tls.key"
        cert.write_bytes(material.cert)
        key.write_bytes(material.key)
        key.chmod(0o600)
        self.ca_bundle = material.ca_bundle
        self.port = free_port()
        # Its log (TLS handshake errors, a fatal error) to a file: a pipe nobody reads could fill and stall it.
        self._log = Path(self._dir.name) / "server.log"
        with self._log.open("wb") as log:
            self._proc = subprocess.Popen([str(binary), "--addr", f"{HOST}:{self.port}", "--cert", str(cert),
                                           "--key", str(key), *(["--http2"] if self.http2 else [])],
                                          stdout=log, stderr=subprocess.STDOUT)

        def exited() -> None:
            if self._proc is not None and self._proc.poll() is not None:
                output = self._log.read_text(errors="replace")
                raise NullWebhookError(f"the null webhook exited ({self._proc.returncode}): {output[-1000:]}")

        try:
            wait_for(self._answers, START_TIMEOUT, "the null webhook's /stats", interval=0.05, alive=exited)
        except BaseException:
            self.stop()
            raise
        return self

    def _answers(self) -> bool:
        try:
            self.stats()
        except OSError:
            return False
        return True

    def stats(self) -> dict[str, int]:
        context = ssl.create_default_context(cadata=self.ca_bundle.decode())
        with urllib.request.urlopen(f"https://{HOST}:{self.port}/stats", context=context, timeout=5) as response:
            answer = json.loads(response.read())
        return {"requests": int(answer["requests"]), "connections": int(answer["connections"])}

    def cpu_seconds(self) -> float | None:
        return proc_stats(self._proc.pid).get("cpu_seconds") if self._proc else None

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def __enter__(self) -> NullWebhook:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
