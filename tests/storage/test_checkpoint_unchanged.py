"""A checkpoint of a table unchanged since the checkpoint it wrote to that path is skipped.

Before, every periodic and shutdown checkpoint rewrote each memory table whole: a 4.6 GB table
took ~8 s each time though nothing had changed. Now the table counts its changes (rows and
state: inserts, samples, priorities, removals, rate-limiter waits, the sampler's RNG), and a
checkpoint to the path it last wrote, with the count unchanged and that checkpoint still the
one on disk, writes nothing. A rewrite makes a new folder (renamed into place): its inode
tells a skip from a write.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from testkit import make_spec, rows

from tdreplay.storage import RateLimitTimeout, Table


def identity(path: Path) -> tuple[int, str]:
    """The checkpoint folder's inode and its metadata's ``created_at`` (a rewrite changes both)."""
    return path.stat().st_ino, json.loads((path / "metadata.json").read_text())["created_at"]


def table_of(tmp_path: Path, **extra: object) -> Table:
    table = Table.create(make_spec("t", capacity=32, **extra), tmp_path / "root", seed=1)
    table.extend(rows(0, 20))
    return table


def test_an_unchanged_table_is_not_written_again(tmp_path: Path) -> None:
    table = table_of(tmp_path)
    path = table.checkpoint(tmp_path / "ckpt")
    first = identity(path)
    again = table.checkpoint(tmp_path / "ckpt")
    assert identity(again) == first  # the same folder: nothing was written
    assert again.skipped and not path.skipped
    assert table.checkpoints["skipped"] == 1 and table.checkpoints["ok"] == 2
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    back = Table.restore(path, tmp_path / "back")
    assert torch.equal(back.read(torch.arange(20))["id"], torch.arange(20))
    assert back.state_dict()["slots"]["inserted"] == 20
    back.destroy()
    table.destroy()


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda t: t.extend(rows(20, 1)), id="extend"),
        pytest.param(lambda t: t.sample(4), id="sample"),  # times sampled, RNG
        pytest.param(lambda t: t.remove(torch.tensor([3])), id="remove"),
        pytest.param(
            lambda t: t.update_priority(torch.tensor([1]), torch.tensor([5.0])), id="priority"
        ),
    ],
)
def test_any_change_of_rows_or_state_is_written(
    tmp_path: Path, change: Callable[[Table], object]
) -> None:
    table = table_of(tmp_path, sampler={"kind": "prioritized"})
    path = table.checkpoint(tmp_path / "ckpt")
    first = identity(path)
    change(table)
    again = table.checkpoint(tmp_path / "ckpt")
    assert identity(again) != first and not again.skipped
    back = Table.restore(again, tmp_path / "back")
    state, got = table.state_dict(), back.state_dict()
    assert torch.equal(state["generator"], got["generator"])
    assert torch.equal(state["slots"]["times_sampled"], got["slots"]["times_sampled"])
    assert state["slots"]["n_live"] == got["slots"]["n_live"]
    assert torch.equal(table.sample(8)["index"], back.sample(8)["index"])  # same future
    back.destroy()
    table.destroy()


def test_a_rate_limiter_wait_is_a_change(tmp_path: Path) -> None:
    """The limiter's wait counters are in the checkpoint: a sample held back changes them."""
    table = table_of(tmp_path, rate_limiter={"min_size_to_sample": 30})
    path = table.checkpoint(tmp_path / "ckpt")
    first = identity(path)
    with pytest.raises(RateLimitTimeout):
        table.sample(1, timeout=0.01)
    again = table.checkpoint(tmp_path / "ckpt")
    assert identity(again) != first
    back = Table.restore(again, tmp_path / "back")
    assert back.state_dict()["rate_limiter"]["sample_waits"] == 1
    back.destroy()
    table.destroy()


def test_a_checkpoint_not_the_one_written_is_written_again(tmp_path: Path) -> None:
    """Only the folder this table wrote, whole and still in place, stands for it."""
    table = table_of(tmp_path)
    path = table.checkpoint(tmp_path / "ckpt")
    # another checkpoint put in its place (another table's, copied over)
    other = Table.create(make_spec("t", capacity=32), tmp_path / "other")
    other.extend(rows(100, 5))
    shutil.rmtree(path)
    other.checkpoint(path)
    other.destroy()
    table.checkpoint(path)
    back = Table.restore(path, tmp_path / "back")
    assert back.size == 20 and int(back.read(torch.tensor([0]))["id"][0]) == 0
    back.destroy()
    # a row file of it damaged (its size changed)
    row = next((path / "storage").rglob("*.memmap"))
    with row.open("ab") as f:
        f.write(b"x")
    assert not table.checkpoint(path).skipped
    Table.restore(path, tmp_path / "back2").destroy()
    # deleted
    shutil.rmtree(path)
    assert not table.checkpoint(path).skipped and (path / "metadata.json").exists()
    # another path, or another layout, is another checkpoint
    assert not table.checkpoint(tmp_path / "elsewhere").skipped
    assert table.checkpoint(tmp_path / "elsewhere").skipped
    table.destroy()
