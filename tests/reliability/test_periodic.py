"""``--checkpoint-every`` in process: which tables, failures counted and survived, a clean stop."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service_helpers import create, extend, info

from tdreplay.storage import Table


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_memory_tables_are_checkpointed_and_memmap_ones_skipped(
    service: Callable[..., Any], tmp_path: Path
) -> None:
    client = service(checkpoint_every=0.05)
    create(client, "t")
    create(client, "m", backend={"kind": "memmap"})
    extend(client, 0, 6)
    folder = tmp_path / "data" / "checkpoints"
    periodic = client.app.state.periodic
    wait_for(lambda: periodic.done >= 2 and (folder / "t" / "metadata.json").exists())
    assert not (folder / "m").exists()
    assert periodic.failures == 0
    task = periodic._task
    client.__exit__(None, None, None)
    assert task.done() and not task.cancelled() and task.exception() is None
    assert client.app.state.periodic is None


def test_a_failing_checkpoint_is_counted_and_the_server_keeps_serving(
    service: Callable[..., Any], tmp_path: Path
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "checkpoints").write_text("not a folder")  # every checkpoint fails
    client = service(checkpoint_every=0.05)
    create(client, "t")
    periodic = client.app.state.periodic
    wait_for(lambda: periodic.failures >= 3)
    assert extend(client, 0, 4).status_code == 200
    assert info(client)["size"] == 4
    metrics = client.get("/metrics").text
    assert 'tdreplay_periodic_checkpoints_total{outcome="failed",table="t"}' in metrics


def test_off_by_default_and_with_zero(service: Callable[..., Any], tmp_path: Path) -> None:
    assert service().app.state.periodic is None
    assert service(checkpoint_every=0, root=tmp_path / "other").app.state.periodic is None


def test_an_unchanged_table_is_not_written_again_periodically_nor_on_stop(
    service: Callable[..., Any], tmp_path: Path, caplog: Any
) -> None:
    """Each round, and the stop, rewrote every memory table whole, changed or not (a 4.6 GB
    table took ~8 s each time); a rewrite renames a new folder into place: a new inode."""
    caplog.set_level(logging.INFO, logger="tdreplay.service")
    client = service(checkpoint_every=0.05, checkpoint_on_shutdown=True)
    create(client, "t")
    extend(client, 0, 6)
    path = tmp_path / "data" / "checkpoints" / "t"
    periodic = client.app.state.periodic
    wait_for(lambda: (path / "metadata.json").exists())
    first = path.stat().st_ino
    rounds = periodic.done
    wait_for(lambda: periodic.done >= rounds + 3)
    assert path.stat().st_ino == first
    assert "unchanged since its checkpoint (skipped, kept)" in caplog.text
    extend(client, 6, 2)  # a change: written again
    wait_for(lambda: path.stat().st_ino != first)
    second = path.stat().st_ino
    rounds = periodic.done
    wait_for(lambda: periodic.done >= rounds + 2)  # the change is checkpointed, then kept
    client.__exit__(None, None, None)
    assert path.stat().st_ino == second  # the stop found it unchanged too
    restored = Table.restore(path, tmp_path / "back")
    assert restored.size == 8
    restored.destroy()
