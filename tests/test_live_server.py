"""``live_server(fresh=True)`` is what the tests of a server's memory rely on: a process
of its own, started with none of the test environment's ``MALLOC_*`` tuning, and with
``gc=False`` no automatic garbage collection. Were it forked, or tuned as CI tunes it,
their measures would pass with the defects they guard against (the shared-memory test
passes with its fix reverted when the collector runs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


def test_a_fresh_server_is_spawned_untuned_and_without_gc(
    live_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "268435456")  # as CI sets it
    fresh = live_server(fresh=True, gc=False)
    assert parent(fresh.proc.pid) == os.getpid()  # not the fork server's child
    environ = Path(f"/proc/{fresh.proc.pid}/environ").read_bytes().split(b"\0")
    tuned = [v for v in environ if v.startswith(b"MALLOC_")]
    assert not tuned, tuned
    assert b"gc.disable()" in Path(f"/proc/{fresh.proc.pid}/cmdline").read_bytes()
    assert fresh.request("GET", "/readyz")[0] == 200


def test_gc_and_wrap_need_a_fresh_process(live_server: Any) -> None:
    for wanted in ({"gc": False}, {"wrap": ["nice"]}):
        with pytest.raises(ValueError, match="fresh=True"):
            live_server(**wanted)
