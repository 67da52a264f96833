"""A checkpoint's sampler state is held to what its sampler could have made.

The state a sampler keeps beside the rows (a without-replacement epoch's
permutation, a slice table's episode ids) decides what a sample returns. A crafted
checkpoint whose state breaks the sampler's promise (an item drawn twice in an
epoch, a slice across two episodes, a queue's item out of order, rate-limiter counts that
hold inserts or samples back for good) is refused with an error naming the part, and
nothing is restored; an honest one, its ring wrapped, restores as it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from testkit import make_spec, rows

from tdreplay.client import InvalidCheckpoint as ClientInvalidCheckpoint
from tdreplay.client import ReplayClient
from tdreplay.codec import protocol
from tdreplay.storage import InvalidCheckpoint, Table
from tdreplay.storage import statefile as SF

END = {"kind": "slice", "slice_len": 4}
TRAJ = {"kind": "slice", "slice_len": 4, "traj_key": "traj", "end_key": None}
TRAJ_FIELD = {"traj": {"shape": [], "dtype": "int64"}}


def edit_state(path: Path, edit: Any) -> None:
    state = SF.load_state(path)
    edit(state)
    SF.save_state(path, state)


def restored_nothing(root: Path) -> bool:
    return not root.exists() or not any(root.rglob("*.memmap"))


def with_traj(start: int, n: int) -> Any:
    batch = rows(start, n)
    return batch.set("traj", batch["id"] // 10)


def test_an_epoch_that_draws_a_slot_twice_is_refused(tables, tmp_path: Path) -> None:
    """Crafted: every entry of the epoch's permutation names one item; restored, ten
    draws 'without replacement' returned that item ten times."""
    table = tables.create(make_spec(capacity=16, sampler={"kind": "without_replacement"}))
    table.extend(rows(0, 12))
    table.sample(2)
    path = table.checkpoint(tmp_path / "ckpt")

    def one_item(state: dict) -> None:
        sampler = state["sampler"]
        sampler["perm"] = torch.full_like(sampler["perm"], int(sampler["perm"][5]))
        sampler["perm_ordinal"] = torch.full_like(
            sampler["perm_ordinal"], int(sampler["perm_ordinal"][5])
        )

    edit_state(path, one_item)
    with pytest.raises(InvalidCheckpoint, match=r"sampler\.perm: slot \d+ appears 12 times"):
        Table.restore(path, root=tmp_path / "r")
    assert restored_nothing(tmp_path / "r")


def test_a_queue_head_past_live_items_is_refused(tables, tmp_path: Path) -> None:
    """Crafted: the head moved past two unread items; restored, they came out after
    newer ones, and inserts into the half-empty queue waited (the writer never passes an
    unread item)."""
    table = tables.create(make_spec(capacity=8, sampler={"kind": "fifo"}))
    table.extend(rows(0, 6))
    table.sample(2)
    path = table.checkpoint(tmp_path / "ckpt")
    edit_state(path, lambda s: s["sampler"].update(head=4))
    with pytest.raises(
        InvalidCheckpoint, match=r"sampler\.head is 4, but slot 2 is live outside the queue"
    ):
        Table.restore(path, root=tmp_path / "r")
    assert restored_nothing(tmp_path / "r")
    edit_state(path, lambda s: s["sampler"].update(head=2))  # the honest head
    restored = tables.restore(path, root=tmp_path / "again")
    restored.extend(rows(6, 2))
    assert restored.sample(6, timeout=1)["id"].tolist() == [2, 3, 4, 5, 6, 7]


SPI = {"samples_per_insert": 2.0, "error_buffer": 10.0, "min_size_to_sample": 2}


@pytest.mark.parametrize(
    "counter, value, message",
    [
        ("inserts", 10**12, r"rate_limiter\.inserts is 1000000000000, but only 12 items"),
        ("samples", 10**12, r"1000000000000 samples of 12 inserts is past what"),
    ],
)
def test_rate_limiter_counters_no_table_could_reach_are_refused(
    tables, tmp_path: Path, counter: str, value: int, message: str
) -> None:
    """Crafted: a trillion inserts held every insert back for good (the limiter waited for
    two trillion samples); a trillion samples held every sample back until half a trillion
    more inserts. Neither count is one a table of 12 inserts can reach."""
    table = tables.create(make_spec(capacity=16, rate_limiter=SPI))
    for start in range(0, 12, 3):
        table.extend(rows(start, 3))
        table.sample(6)
    path = table.checkpoint(tmp_path / "ckpt")
    edit_state(path, lambda s: s["rate_limiter"].update({counter: value}))
    with pytest.raises(InvalidCheckpoint, match=message):
        Table.restore(path, root=tmp_path / "r")
    assert restored_nothing(tmp_path / "r")
    edit_state(path, lambda s: s["rate_limiter"].update(inserts=12, samples=24))  # honest
    restored = tables.restore(path, root=tmp_path / "again")
    restored.extend(rows(12, 3), timeout=1)
    assert len(restored.sample(6, timeout=1)) == 6


@pytest.mark.parametrize(
    "edit, message",
    [
        (  # one episode id for every item: slices ran across the done flags
            lambda s: s["sampler"]["episode"].zero_(),
            r"sampler\.episode: slot 10 is in episode 0, but the item before it \(slot 9, "
            r"'next\.done' 1\) is in episode 0: expected 1",
        ),
        (  # the next insert joined the ended episode of the newest item
            lambda s: s.update(episode_base=s["episode_base"] - 1),
            r"episode_base is 2, but the newest item \(slot 29, episode 2, 'next\.done' 1\) "
            r"makes it 3",
        ),
    ],
    ids=["episodes", "episode_base"],
)
def test_episode_ids_that_disagree_with_the_end_flags_are_refused(
    tables, tmp_path: Path, edit: Any, message: str
) -> None:
    table = tables.create(make_spec(capacity=32, sampler=END))
    table.extend(rows(0, 30))
    path = table.checkpoint(tmp_path / "ckpt")
    edit_state(path, edit)
    with pytest.raises(InvalidCheckpoint, match=message):
        Table.restore(path, root=tmp_path / "r")
    assert restored_nothing(tmp_path / "r")


def test_episode_ids_that_disagree_with_the_trajectory_key_are_refused(
    tables, tmp_path: Path
) -> None:
    table = tables.create(make_spec(capacity=32, sampler=TRAJ, fields=TRAJ_FIELD))
    table.extend(with_traj(0, 30))
    path = table.checkpoint(tmp_path / "ckpt")
    edit_state(path, lambda s: s["sampler"]["episode"].zero_())
    with pytest.raises(InvalidCheckpoint, match=r"slot 10 is in episode 0, but its 'traj' is 1"):
        Table.restore(path, root=tmp_path / "r")


@pytest.mark.parametrize("sampler", [END, TRAJ], ids=["end_key", "traj_key"])
def test_a_wrapped_slice_table_restores_as_it_was(tables, tmp_path: Path, sampler: dict) -> None:
    """The honest case: the ring wrapped mid-episode, an insert half an episode long."""
    spec = make_spec(capacity=16, sampler=sampler, fields=TRAJ_FIELD)
    table = tables.create(spec)
    for start in range(0, 35, 5):
        table.extend(with_traj(start, 5))
    path = table.checkpoint(tmp_path / "ckpt")
    restored = tables.restore(path, root=tmp_path / "r")
    assert restored.sampler.n_valid == table.sampler.n_valid > 0
    for t in (table, restored):
        t.extend(with_traj(35, 3))
    assert torch.equal(restored.sampler.episode, table.sampler.episode)
    ids = restored.sample(16)["id"].reshape(-1, 4)
    assert (ids.diff(dim=1) == 1).all() and (ids // 10 == ids[:, :1] // 10).all(), ids


def test_a_server_refuses_the_crafted_state_and_keeps_serving(live_server: Any) -> None:
    """Over a real server: the restore is refused (422) naming the part, the table it would have
    replaced keeps its rows and serves, and the honest checkpoint restores afterwards."""
    server = live_server()
    spec = make_spec("ep", capacity=32, sampler=END).model_dump(mode="json")
    with ReplayClient(server.url) as client:
        client.create_table(spec)
        client.extend("ep", rows(0, 30))
        client.checkpoint("ep", "checkpoints/ep")
        path = server.root / protocol.CHECKPOINTS / "ep"
        honest = (path / SF.STATE_FILE).read_bytes()
        edit_state(path, lambda s: s["sampler"]["episode"].zero_())
        client.extend("ep", rows(30, 2))
        with pytest.raises(ClientInvalidCheckpoint, match=r"sampler\.episode: slot 10"):
            client.restore("ep", "checkpoints/ep")
        assert client.info("ep")["size"] == 32
        assert client.sample("ep", 8)["id"].reshape(-1, 4).diff(dim=1).eq(1).all()
        (path / SF.STATE_FILE).write_bytes(honest)
        assert client.restore("ep", "checkpoints/ep")["size"] == 30
    assert json.loads((path / "metadata.json").read_text())["hi"] == 30
