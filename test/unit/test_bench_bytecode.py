"""The bench starts controllers from byte code, as the image does, whatever ``PYTHONDONTWRITEBYTECODE`` says."""

from __future__ import annotations

import importlib.util
import struct
import sys
from pathlib import Path

import pytest

import mcad.wiring
from test.perf import harness


def test_every_controller_start_finds_current_byte_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # what PYTHONDONTWRITEBYTECODE=1 sets
    harness.byte_compiled.cache_clear()
    source = Path(mcad.wiring.__file__)
    cached = Path(importlib.util.cache_from_source(str(source)))
    cached.unlink(missing_ok=True)
    assert harness.byte_compiled()
    header = cached.read_bytes()[:16]
    assert header[:4] == importlib.util.MAGIC_NUMBER
    flags, mtime, size = struct.unpack("<III", header[4:16])
    # Checked against the source's mtime and size, as an import checks it: not stale.
    assert (flags, mtime, size) == (0, int(source.stat().st_mtime) & 0xFFFFFFFF, source.stat().st_size & 0xFFFFFFFF)


def test_a_checkout_that_cannot_take_byte_code_is_said_once_and_not_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # As root, no file mode stops a write here: the stdlib's answer for a read-only checkout stands in for one.
    monkeypatch.setattr(harness.compileall, "compile_dir", lambda *args, **kwargs: False)
    harness.byte_compiled.cache_clear()
    try:
        assert not harness.byte_compiled()
        assert not harness.byte_compiled()
    finally:
        harness.byte_compiled.cache_clear()
    said = capsys.readouterr()
    assert (said.out + said.err).count("could not write the byte code") == 1
