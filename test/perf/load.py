"""An on-time load generator: creates objects at the offsets a schedule gives, from several processes.

Contract:
- ``OnTimeLoad(kubeconfig, path, schedule, build, processes=P, threads=T)``: ``schedule`` is a list of
  ``(offset seconds, args)``; ``build(args)`` (a module-level function, so that a spawned process can name it)
  returns the body to POST to ``path`` (or to ``path(body)``, a module-level function too: AppWrappers spread over
  namespaces), named by its ``metadata.name``. ``start()`` spawns the processes, waits
  until each has its client ready, and returns ``t0``: the ``time.monotonic()`` the offsets count from, a little
  in the future. ``time.monotonic()`` is CLOCK_MONOTONIC, one clock for every process of the machine, so the
  timestamps the processes take are comparable with the parent's (its watches' and its finisher's).
- Each process owns every P-th entry of the schedule (round-robin in schedule order, so the processes share each
  burst), sleeps until each entry's time, and hands it to its pool of T threads, each with its own keep-alive
  connection. A create that returns is stamped then: ``created[name]``, and its lateness is that stamp minus its
  scheduled time (so the API server's answer time counts as lateness: a slow API server makes the load late, and
  the load says so instead of shrinking). ``created_count()`` is live (for progress lines); ``created``,
  ``lateness``, ``calls`` (each create call's duration) and ``cpu_seconds`` (the processes' own CPU from t0 on)
  are filled when ``join()`` collects each process's record. A schedule of offsets 0 is a closed loop of P x T
  creators, each starting its next create when its last returned (the throughput scenario's "as fast as they
  can").
- The first failed create stops that process's schedule and is reported: ``errors`` (live count in
  ``failed()``), and ``join()`` returns once every process has ended, within its timeout (then it kills them).
  Nothing is retried: a benchmark whose load failed has no figure.

Why processes: one Python process that creates a few hundred objects a second while it also parses the watches it
measures with and deletes finished workloads ran 23-45 s behind Kueue's schedule in churn, on its GIL
as much as on the API server; the creating processes share neither.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import multiprocessing.connection
import queue as queue_mod
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from test.perf.client import Api, Obj

# How far ahead of now t0 is set, so every process is waiting for the first entry when it is due.
LEAD_SECONDS = 0.5
READY_TIMEOUT_SECONDS = 120.0


def _run(kubeconfig: str, path: str | Callable[[Obj], str], entries: list[tuple[float, Any]],
         build: Callable[[Any], Obj], threads: int, ready: Any, start: Any, t0: Any, counter: Any, failures: Any,
         out: Any) -> None:
    """One creating process (spawned): the entries it owns, on its own connection pool."""
    api = Api(kubeconfig, pool_size=threads)
    # Built and encoded before t0, not on the schedule's time.
    bodies = [(offset, body["metadata"]["name"], path(body) if callable(path) else path,
               json.dumps(body, separators=(",", ":")).encode())
              for offset, body in ((offset, build(args)) for offset, args in entries)]
    ready.put(True)
    if not start.wait(2 * READY_TIMEOUT_SECONDS):  # the parent waits at most READY_TIMEOUT_SECONDS for all
        return  # the parent never started the schedule (it failed or was killed): nothing to create, no record
    base = t0.value
    cpu_at_start = time.process_time()
    created: dict[str, float] = {}
    late: list[float] = []
    calls: list[float] = []
    errors: list[str] = []

    def create(offset: float, name: str, target: str, data: bytes) -> None:
        if errors:
            return
        sent = time.monotonic()
        try:
            api.post_encoded(target, data)
        except Exception as err:  # reported, never retried: the run has no figure then
            errors.append(f"{name}: {err}")
            with failures.get_lock():
                failures.value += 1
            return
        now = time.monotonic()
        created[name] = now  # dict writes are atomic under the GIL
        late.append(now - (base + offset))
        calls.append(now - sent)
        with counter.get_lock():
            counter.value += 1

    with ThreadPoolExecutor(threads, thread_name_prefix="load") as pool:
        for offset, name, target, data in bodies:
            left = base + offset - time.monotonic()
            if left > 0:
                time.sleep(left)
            if errors:
                break
            pool.submit(create, offset, name, target, data)
    out.send({"created": created, "lateness": late, "calls": calls, "errors": errors,
              "cpu_seconds": time.process_time() - cpu_at_start})
    out.close()


class OnTimeLoad:
    def __init__(self, kubeconfig: str, path: str | Callable[[Obj], str], schedule: list[tuple[float, Any]],
                 build: Callable[[Any], Obj], *, processes: int = 4, threads: int = 8) -> None:
        if processes < 1 or threads < 1:
            raise ValueError(f"an on-time load needs processes >= 1 and threads >= 1 ({processes}, {threads})")
        self.processes = min(processes, max(1, len(schedule)))
        self.threads = threads
        ctx = mp.get_context("spawn")  # never fork the parent: its watch and finisher threads hold locks
        self._ready = ctx.Queue()
        self._start = ctx.Event()
        self._t0 = ctx.Value("d", 0.0)
        self._counter = ctx.Value("i", 0)
        self._failures = ctx.Value("i", 0)
        ordered = sorted(schedule, key=lambda entry: entry[0])
        self._pipes: list[multiprocessing.connection.Connection] = []
        self._procs: list[Any] = []
        for i in range(self.processes):
            receive, send = ctx.Pipe(duplex=False)
            self._pipes.append(receive)
            self._procs.append(ctx.Process(
                target=_run, name=f"load-{i}", daemon=True,
                args=(kubeconfig, path, ordered[i::self.processes], build, threads, self._ready, self._start,
                      self._t0, self._counter, self._failures, send)))
        self.created: dict[str, float] = {}
        self.lateness: list[float] = []
        self.calls: list[float] = []  # how long each create call took
        self.errors: list[str] = []
        self.cpu_seconds = 0.0  # what the processes spent from t0 to their record, all threads
        self.t0 = 0.0

    def start(self) -> float:
        for proc in self._procs:
            proc.start()
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        for _ in self._procs:
            try:
                self._ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue_mod.Empty:
                self.kill()
                raise RuntimeError(f"the load processes were not ready within {READY_TIMEOUT_SECONDS:g} s") from None
        self.t0 = time.monotonic() + LEAD_SECONDS
        self._t0.value = self.t0
        self._start.set()
        return self.t0

    def created_count(self) -> int:
        return int(self._counter.value)

    def failed(self) -> int:
        return int(self._failures.value)

    def join(self, timeout: float) -> None:
        """Collect every process's record (blocking until each has sent it, within ``timeout`` in all)."""
        deadline = time.monotonic() + timeout
        for pipe, proc in zip(self._pipes, self._procs, strict=True):
            left = max(0.0, deadline - time.monotonic())
            if not pipe.poll(left):
                self.kill()
                raise RuntimeError(f"load process {proc.name} sent no record within {timeout:g} s")
            record = pipe.recv()
            self.created.update(record["created"])
            self.lateness.extend(record["lateness"])
            self.calls.extend(record["calls"])
            self.errors.extend(record["errors"])
            self.cpu_seconds += record.get("cpu_seconds", 0.0)
            proc.join(timeout=max(1.0, deadline - time.monotonic()))
        if self._counter.value != len(self.created):
            self.errors.append(f"{self._counter.value} creates counted, {len(self.created)} recorded")

    def alive(self) -> bool:
        """Some process has entries left to create (or has not sent its record)."""
        return any(proc.is_alive() for proc in self._procs)

    def kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(timeout=5)
