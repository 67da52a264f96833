"""The writer's column buffer (no I/O): layout from the first step, checks, growth, refusals."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from tdreplay.client import ChunkBuffer
from tdreplay.client.columns import ColumnBuffer


def step(i: int, *, done: bool = False) -> TensorDict:
    return TensorDict({"id": torch.tensor(i), "next": {"done": torch.tensor([done])}}, [])


def test_a_first_step_without_the_end_key_leaves_no_layout() -> None:
    buf = ChunkBuffer(4, end_key="next.done")
    with pytest.raises(KeyError, match=r"no key 'next\.done'"):
        buf.append(TensorDict({"id": torch.tensor(0)}, []))
    assert buf.n == 0
    buf.append(step(1, done=True))  # the right layout is learned from this one
    assert [c["id"].tolist() for c in buf.take(final=True)] == [[1]]


def test_keys_in_another_order_are_matched_by_name() -> None:
    buf = ChunkBuffer(2)
    buf.append(step(0))
    buf.append(TensorDict({"next": {"done": torch.tensor([True])}, "id": torch.tensor(1)}, []))
    (chunk,) = buf.take()
    assert chunk["id"].tolist() == [0, 1] and chunk["next", "done"].flatten().tolist() == [
        False,
        True,
    ]


def test_steps_that_require_grad_are_copied_without_their_graph() -> None:
    cols = ColumnBuffer(2)
    x = torch.ones(3, requires_grad=True)
    cols.append(TensorDict({"x": x * 2}, []))
    chunk = cols.front(1, copy=False)
    assert not chunk["x"].requires_grad and chunk["x"].tolist() == [[2.0, 2.0, 2.0]]


def test_the_buffer_grows_for_long_episodes_and_moves_rows_to_the_front() -> None:
    buf = ChunkBuffer(2, end_key="next.done")
    out = []
    for i in range(20):
        buf.append(step(i, done=i in (6, 7, 15)))
        out += buf.take(borrow=True)  # views: read before the next append
        out = [c.clone() for c in out]
    # 7 alone is a whole episode but short of the chunk: it goes with 8..15
    assert [c["id"].tolist() for c in out] == [list(range(7)), list(range(7, 16))]
    assert buf.unfinished() == 4
    assert [c["id"].tolist() for c in buf.take(final=True)] == [[16, 17, 18, 19]]


def test_non_tensor_entries_are_left_out_as_on_the_wire() -> None:
    cols = ColumnBuffer(2)
    for i in range(2):
        td = TensorDict({"x": torch.full((1,), i), "sub": {"y": torch.tensor(i)}}, [])
        td.set_non_tensor("note", "hello")  # the codec sends tensors only
        cols.append(td)
    chunk = cols.front(2, copy=True)
    assert set(chunk.keys(True, True)) == {"x", ("sub", "y")}
    assert chunk["sub", "y"].tolist() == [0, 1]
