"""test.support.frozen_process: the block runs only while every thread of the process is stopped."""

from __future__ import annotations

import subprocess
import sys

from test.support import _all_threads_stopped, frozen_process, wait_until

# Several threads, each busy, so a stop has to reach threads running on other cores.
BUSY_THREADS = """
import threading
def spin():
    while True:
        pass
for _ in range(3):
    threading.Thread(target=spin, daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def test_every_thread_is_stopped_inside_the_block_and_resumed_after() -> None:
    proc = subprocess.Popen([sys.executable, "-c", BUSY_THREADS], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert not _all_threads_stopped(proc.pid)
        with frozen_process(proc.pid):
            assert _all_threads_stopped(proc.pid)
        wait_until(lambda: not _all_threads_stopped(proc.pid), timeout=10, what="the process to run again")
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()
