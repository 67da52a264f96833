"""The writer's column buffer (no I/O): layout from the first step, checks, growth, refusals."""

from __future__ import annotations

from typing import Any

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


def test_later_steps_take_the_fast_path_and_differing_ones_the_checked_way() -> None:
    """After the first step, a plain TensorDict of the same key tree is read from its key dicts;
    any other step (another order, a tensorclass, a lazy stack inside) still goes in, checked."""
    from tensordict import LazyStackedTensorDict, tensorclass

    @tensorclass
    class Step:
        id: torch.Tensor
        next: TensorDict

    cols = ColumnBuffer(8)
    cols.append(step(0))
    cols.append(step(1))  # the fast path
    cols.append(TensorDict({"next": {"done": torch.tensor([True])}, "id": torch.tensor(2)}, []))
    lazy = LazyStackedTensorDict(TensorDict({"done": torch.tensor(False)}, []), stack_dim=0)
    cols.append(TensorDict({"id": torch.tensor(3), "next": lazy}, []))  # done: [1] as well
    cols.append(Step(id=torch.tensor(4), next=TensorDict({"done": torch.tensor([True])}, [])))
    cols.append(step(5))
    chunk = cols.front(6, copy=True)
    assert chunk["id"].tolist() == [0, 1, 2, 3, 4, 5]
    assert chunk["next", "done"].flatten().tolist() == [False, False, True, False, True, False]


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (
            lambda: step(1).set("id", torch.zeros(2, dtype=torch.int64)),
            ValueError,
            r"'id' has shape \[2\]",
        ),
        (lambda: step(1).set("id", torch.tensor(1.0)), TypeError, r"'id' has dtype torch\.float32"),
        (
            lambda: step(1).set(("next", "done"), torch.tensor([1])),
            TypeError,
            r"'next\.done' has dtype",
        ),
        (lambda: step(1).set(("next", "x"), torch.tensor(1)), KeyError, r"has key.*next\.x"),
        (
            lambda: TensorDict({"id": torch.tensor(1), "next": {}}, []),
            KeyError,
            r"lacks key.*next\.done",
        ),
        (
            lambda: TensorDict({"id": torch.tensor(1), "next": torch.tensor(0)}, []),
            KeyError,
            r"lacks",
        ),
    ],
)
def test_a_step_unlike_the_first_falls_back_and_is_refused_naming_what_differs(
    bad: object, error: type[Exception], match: str
) -> None:
    cols = ColumnBuffer(4)
    cols.append(step(0))
    cols.append(step(1))
    with pytest.raises(error, match=match):
        cols.append(bad())  # type: ignore[operator]
    assert cols.n == 2  # nothing changed
    cols.append(step(2))  # and the fast path goes on
    assert cols.front(3, copy=True)["id"].tolist() == [0, 1, 2]


def test_a_batch_is_never_taken_for_one_step() -> None:
    """A ``[k]`` batch whose leaves have the step's shapes (one row each of one dim less) is refused."""
    cols = ColumnBuffer(4)
    cols.append(TensorDict({"x": torch.zeros(3)}, []))
    with pytest.raises(ValueError, match=r"'x' has shape \[\]"):
        cols.append(TensorDict({"x": torch.ones(3)}, [3]))
    assert cols.n == 1


def test_the_fast_path_copies_without_the_graph_and_keeps_grad_mode() -> None:
    cols = ColumnBuffer(2)
    x = torch.ones(3, requires_grad=True)
    cols.append(TensorDict({"x": x * 1}, []))
    cols.append(TensorDict({"x": x * 2}, []))  # the fast path
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    with pytest.raises(TypeError, match="meta tensor"):  # the copy fails: modes restored too
        cols.append(TensorDict({"x": torch.empty(3, device="meta")}, []))
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
    chunk = cols.front(2, copy=False)
    assert not chunk["x"].requires_grad and chunk["x"].tolist() == [[1.0] * 3, [2.0] * 3]
    assert not chunk["x"].is_inference()  # columns usable outside inference mode


def test_steps_appended_in_inference_mode_leave_columns_usable_outside_it() -> None:
    """A collector appends under ``torch.inference_mode()`` and extends or flushes outside
    it: the columns (and a lent set's spare) were allocated in the caller's mode, inference
    tensors then, and any later in-place copy outside inference mode (rows extended, live
    rows moved to the front) failed with torch's 'Inplace update to inference tensor'."""
    cols = ColumnBuffer(8)
    with torch.inference_mode():
        cols.append(TensorDict({"x": torch.zeros(3)}, []))
    assert cols.append(TensorDict({"x": torch.ones(2, 3)}, [2])) == 2
    with torch.inference_mode():
        lent = cols.lend()  # a chunk sent while collecting: the spare allocated then
    cols.reclaim(lent)
    assert cols.append(TensorDict({"x": torch.full((2, 3), 2.0)}, [2])) == 2
    chunk = cols.front(5, copy=False)
    assert not chunk["x"].is_inference()
    assert chunk["x"][:, 0].tolist() == [0.0, 1.0, 1.0, 2.0, 2.0]


def test_lent_columns_stay_as_they_are_until_reclaimed_and_are_reused() -> None:
    cols = ColumnBuffer(4)
    for i in range(5):
        cols.append(step(i))
    first = [c.data_ptr() for c in cols._cols]
    sent = cols.front(4, copy=False)  # rows 0..3 as views
    lent = cols.lend()  # row 4 moves to a second set of columns
    for i in range(5, 8):  # without lend() these would overwrite rows 0..3
        cols.append(step(i))
    assert sent["id"].tolist() == [0, 1, 2, 3]
    second = [c.data_ptr() for c in cols._cols]
    assert second != first
    cols.reclaim(lent)  # sent: the first set is the spare now
    cols.front(2, copy=False)
    cols.reclaim(cols.lend())
    assert [c.data_ptr() for c in cols._cols] == first  # the two sets take turns
    assert cols.front(2, copy=True)["id"].tolist() == [6, 7]


def test_a_lent_set_of_the_old_size_is_let_go() -> None:
    cols = ColumnBuffer(2)
    for i in range(2):
        cols.append(step(i))
    cols.front(2, copy=False)
    lent = cols.lend()
    for i in range(2, 7):  # the buffer grows past the lent set's size
        cols.append(step(i))
    cols.reclaim(lent)
    assert cols._spare is None
    assert cols.front(5, copy=True)["id"].tolist() == [2, 3, 4, 5, 6]


def nested_step(i: int) -> TensorDict:
    """A step shaped like a TorchRL transition: leaves around and inside two nested levels."""
    g = torch.Generator().manual_seed(i)
    return TensorDict(
        {
            "observation": torch.randn(4, generator=g),
            "action": torch.randint(0, 2, (2,), generator=g),
            "done": torch.tensor([i % 3 == 2]),
            "next": {
                "observation": torch.randn(4, generator=g),
                "reward": torch.rand(1, generator=g),
                "done": torch.tensor([i % 3 == 2]),
            },
            "collector": {"traj_ids": torch.tensor(i // 3)},
        },
        [],
    )


def test_the_fast_path_stores_what_the_general_path_stores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After the first step every plain step takes the fast path, and the columns come out
    as the general path (``_append_any``, checked leaf by leaf) makes them."""
    steps = [nested_step(i) for i in range(10)]
    slow = ColumnBuffer(4)
    for s in steps:
        slow._append_any(s)
    fast = ColumnBuffer(4)
    fast.append(steps[0])
    general = ColumnBuffer._append_any
    calls: list[object] = []

    def counted(self: ColumnBuffer, data: object) -> int:
        calls.append(data)
        return general(self, data)

    monkeypatch.setattr(ColumnBuffer, "_append_any", counted)
    for s in steps[1:]:
        fast.append(s)
    assert not calls  # every later step took the fast path
    a, b = fast.front(10, copy=True), slow.front(10, copy=True)
    keys = list(b.keys(True, True))
    assert list(a.keys(True, True)) == keys and len(keys) == 7
    for key in keys:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    "change",
    [
        lambda td: td.set(("next", "extra"), torch.tensor(1.0)),  # a new key, nested
        lambda td: td.set("extra", torch.tensor(1.0)),  # a new key at the root
        lambda td: td.del_(("next", "reward")),  # a key gone
        lambda td: td.set(("next", "reward"), torch.rand(1, dtype=torch.float64)),  # dtype
        lambda td: td.set(("next", "reward"), torch.rand(())),  # shape (would broadcast)
        lambda td: td.set("observation", torch.randn(1)),  # shape (would broadcast)
        lambda td: td.set("action", torch.tensor([1, 0], dtype=torch.int32)),  # dtype (would cast)
        lambda td: td.set("collector", torch.tensor(0)),  # a tree now a leaf
    ],
)
def test_a_step_that_changes_mid_chunk_is_refused_as_the_general_path_refuses_it(
    change: Any,
) -> None:
    """A step unlike the others, after several that took the fast path, falls back and gets
    the very error the general path gives; nothing changes and the fast path goes on."""
    errors = []
    for general in (False, True):
        cols = ColumnBuffer(8)
        for i in range(5):
            (cols._append_any if general else cols.append)(nested_step(i))
        bad = nested_step(5)
        change(bad)
        with pytest.raises((KeyError, ValueError, TypeError)) as info:
            (cols._append_any if general else cols.append)(bad)
        errors.append((type(info.value), str(info.value)))
        assert cols.n == 5
        cols.append(nested_step(6))
        assert cols.front(6, copy=True)["collector", "traj_ids"].tolist() == [0, 0, 0, 1, 1, 2]
    assert errors[0] == errors[1]


def test_a_step_changed_in_place_after_append_leaves_its_row_as_it_was() -> None:
    """Environments often write the next step into the same tensors: append copies at once.

    Copies are not deferred to the chunk (one stack per column would be cheaper) because
    no check could tell a step changed meanwhile: a write through numpy, shared memory or
    another process leaves torch's version counter as it was.
    """
    cols = ColumnBuffer(4)
    s = nested_step(0)
    expected = []
    for i in range(4):
        s["observation"].fill_(float(i))  # in place: torch's version counter sees this
        s["next", "reward"].numpy()[:] = i  # through numpy: nothing in torch sees this
        cols.append(s)
        expected.append(s.clone())
    s["observation"].zero_()
    s["next", "reward"].numpy()[:] = -1
    chunk = cols.front(4, copy=False)
    assert chunk["observation"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert chunk["next", "reward"].flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert all((chunk[i] == e).all() for i, e in enumerate(expected))


def test_steps_in_modes_the_c_check_was_not_made_in_still_take_the_fast_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The C check (``leaves.layout_guard``) knows the mode and ``requires_grad`` it was made
    for: a step it does not know is checked the Python way, and takes the fast path; a
    collector that switches modes for good gets a C check made again, one that keeps
    switching the Python check alone, and every row is as appended."""
    cols = ColumnBuffer(64)
    cols.append(nested_step(0))
    general = ColumnBuffer._append_any
    calls: list[object] = []
    monkeypatch.setattr(
        ColumnBuffer, "_append_any", lambda self, d: calls.append(d) or general(self, d)
    )
    x = torch.ones(4, requires_grad=True)
    steps = []
    for i in range(1, 30):
        s = nested_step(i)
        if i % 2:
            s["observation"] = x * i  # requires grad, unlike the first step
        steps.append(s)
        if i < 8 or i % 3:
            cols.append(s)
        else:
            with torch.inference_mode():
                cols.append(s)
        if i == 1:
            assert cols._guard is not None  # the C check, made from the first fast step
    assert not calls and cols._guard is None  # switched too often: the Python check alone
    chunk = cols.front(30, copy=False)
    assert not chunk.requires_grad and not chunk["observation"].requires_grad
    for i, s in enumerate(steps, 1):
        assert (chunk[i] == s.detach()).all(), i
