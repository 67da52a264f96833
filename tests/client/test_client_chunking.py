"""The writer's chunking rule (no I/O): plain tables, end flags, trajectory ids."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import ChunkBuffer
from tdreplay.client.writer import episode_keys


def step(i: int, *, done: bool = False, traj: int = 0) -> TensorDict:
    return TensorDict(
        {
            "id": torch.tensor(i),
            "episode": torch.tensor(traj),
            "next": {"done": torch.tensor([done])},
        },
        [],
    )


def ids(chunks: list[TensorDict]) -> list[list[int]]:
    return [c["id"].tolist() for c in chunks]


def test_plain_chunks_are_exact() -> None:
    buf = ChunkBuffer(4)
    out = []
    for i in range(10):
        buf.append(step(i))
        out += buf.take()
    assert ids(out) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ids(buf.take(expired=True)) == [[8, 9]]
    assert buf.n == 0


def test_plain_accepts_batches_of_steps() -> None:
    buf = ChunkBuffer(4)
    buf.append(torch.stack([step(i) for i in range(9)]))
    assert ids(buf.take()) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert ids(buf.take(final=True)) == [[8]]


def test_end_flags_cut_only_after_an_end() -> None:
    buf = ChunkBuffer(4, end_key="next.done")
    out = []
    for i in range(12):
        buf.append(step(i, done=i in (2, 6, 7)))
        out += buf.take()
    # 0..2 is whole but short (3 < 4): waits; 0..6 is 7 >= 4: sent; 7 alone is short; 8.. open
    assert ids(out) == [[0, 1, 2, 3, 4, 5, 6]]
    rest = buf.take(expired=True)
    assert ids(rest) == [[7]]
    assert all(c["next", "done"][-1].item() for c in out + rest)
    assert buf.unfinished() == 4  # steps 8..11 wait for their end


def test_time_limit_sends_whole_episodes_only() -> None:
    buf = ChunkBuffer(100, end_key="next.done")
    for i in range(5):
        buf.append(step(i, done=i == 1))
    assert buf.take() == []
    due = buf.due(0.0)
    assert due is not None and due <= 0
    assert ids(buf.take(expired=True)) == [[0, 1]]
    assert buf.due(0.0) is None  # the unfinished episode waits, whatever the time


def test_trajectory_ids_cut_before_a_new_id() -> None:
    buf = ChunkBuffer(3, episode_key="episode")
    out = []
    for i, traj in enumerate([0, 0, 0, 0, 1, 1, 2]):
        buf.append(step(i, traj=traj))
        out += buf.take()
    assert ids(out) == [[0, 1, 2, 3]]  # 4, 5 are whole but short of the target
    assert ids(buf.take(final=True)) == [[4, 5, 6]]  # ids keep the unfinished episode apart


def test_trajectory_ids_across_sends() -> None:
    buf = ChunkBuffer(2, episode_key="episode")
    for i, traj in enumerate([0, 0, 1]):
        buf.append(step(i, traj=traj))
    assert ids(buf.take()) == [[0, 1]]
    buf.append(step(3, traj=1))
    buf.append(step(4, traj=2))
    assert ids(buf.take()) == [[2, 3]]


def test_episode_longer_than_capacity_is_split_with_a_warning() -> None:
    buf = ChunkBuffer(4, end_key="next.done", max_rows=6)
    with pytest.warns(RuntimeWarning, match="longer than the table's capacity"):
        for i in range(7):
            buf.append(step(i))
            chunks = buf.take()
            if chunks:
                assert ids(chunks) == [[0, 1, 2, 3, 4, 5]]


def test_whole_episodes_are_sent_before_a_long_one_grows_past_capacity() -> None:
    buf = ChunkBuffer(4, end_key="next.done", max_rows=5)
    buf.append(step(0, done=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for i in range(1, 6):
            buf.append(step(i))
            out = buf.take()
            if out:
                assert ids(out) == [[0]]


def test_chunk_is_capped_by_capacity() -> None:
    assert ChunkBuffer(1000, max_rows=64).chunk == 64


def test_due_counts_from_the_oldest_step() -> None:
    buf = ChunkBuffer(10)
    assert buf.due(1.0) is None
    buf.append(step(0))
    left = buf.due(5.0)
    assert left is not None and 4.0 < left <= 5.0
    assert buf.first_at is not None and buf.first_at <= time.monotonic()


def test_episode_keys_from_info() -> None:
    plain = {"capacity": 10, "sampler": {"kind": "uniform"}, "fields": {}}
    assert episode_keys(plain, None, None) == (None, None, 10)
    slice_info = {
        "capacity": 50,
        "sampler": {"kind": "slice", "slice_len": 4},
        "fields": {"next.done": {}, "episode": {}},
    }
    assert episode_keys(slice_info, None, None) == (None, "next.done", 50)
    assert episode_keys(slice_info, "episode", None) == ("episode", None, 50)
    with_traj = dict(slice_info, sampler={"kind": "slice", "traj_key": "episode"})
    assert episode_keys(with_traj, None, None) == ("episode", None, 50)
    sharded = dict(plain, shards=[{"capacity": 10}, {"capacity": 7}])
    assert episode_keys(sharded, None, None)[2] == 7
    with pytest.raises(ValueError, match="traj_key"):
        episode_keys(dict(slice_info, fields={}), None, None)
