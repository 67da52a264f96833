"""The stats scan: callers that meet one under way take its figures, and never go without."""

from __future__ import annotations

import threading
import time

from testkit import make_spec, rows


def test_a_caller_whose_scanner_gave_up_scans_itself(tables) -> None:
    """A scanner may give up (its own wait for the table's lock ran out: the /status
    history's tick waits 50 ms) and leave no figures. A caller that waited for it then
    scans itself, rather than answer without figures (seen: no ``priority_max`` in a
    client's stats when its call met the tick)."""
    table = tables.create(make_spec(capacity=16, sampler={"kind": "prioritized"}))
    table.extend(rows(0, 6))
    table.sample(4)
    got: list = []
    table._scans.running.acquire()  # a scanner under way
    caller = threading.Thread(
        target=lambda: got.append(table._scans.figures(table._cond, table._live_state, None))
    )
    caller.start()
    time.sleep(0.1)  # the caller waits for it
    assert caller.is_alive()
    table._scans.running.release()  # it gave up: no figures left behind
    caller.join(10)
    figures, fresh = got[0]
    assert fresh and figures is not None
    assert figures["priority"]["max"] == 1.0 and figures["unique_sampled"] >= 1


def test_a_caller_with_no_time_left_gets_the_last_figures_marked_stale(tables) -> None:
    table = tables.create(make_spec(capacity=16, sampler={"kind": "prioritized"}))
    table.extend(rows(0, 6))
    first, fresh = table._scans.figures(table._cond, table._live_state, None)
    assert fresh and first is not None
    table._scans.last = (time.monotonic() - 10, 1.0, first)  # out of date
    table._scans.running.acquire()
    try:
        figures, fresh = table._scans.figures(
            table._cond, table._live_state, 0.05
        )  # its wait runs out while the scan is under way
    finally:
        table._scans.running.release()
    assert figures is first and not fresh


def test_a_small_tables_scan_is_never_reused_however_long_it_took(tables, monkeypatch) -> None:
    """A first scan may cost over a millisecond of CPU (torch warming up); a small table's
    figures must not be reused for it (seen: an empty table's figures kept while items came)."""
    from tdreplay.storage.table import stats as S

    slow, real = [True], S.scan

    def scan(*args):
        if slow[0]:  # burn CPU, as a cold first call can
            end = time.thread_time() + 0.005
            while time.thread_time() < end:
                pass
        return real(*args)

    monkeypatch.setattr(S, "scan", scan)
    table = tables.create(make_spec(capacity=16, sampler={"kind": "prioritized"}))
    assert table.stats()["priority"]["max"] is None  # empty
    slow[0] = False
    table.extend(rows(0, 6))
    assert table.stats()["priority"]["max"] == 1.0  # scanned again, not the empty figures
