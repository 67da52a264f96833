"""Parity: the same calls on TorchRL's ``TensorDictReplayBuffer`` and on ``TDReplayBuffer``.

Each table kind has a list of steps (:data:`STEPS`), one call per line, applied
to TorchRL's in-process buffer over ``LazyTensorStorage(capacity)`` and to a
``TDReplayBuffer`` on a real server (:class:`~parity_kit.Twins`), comparing
after each: slots returned, ``len``, ``write_count``, keys, dtypes and shapes,
rows read by index, what the caller's TensorDict holds after ``extend``, and
sampled rows (random, so checked by content: each is a row held now, in the
slot its ``index`` names, and slices are runs of one episode). Priorities are
checked against what TorchRL's ``PrioritizedSampler`` documents (its C++
extension does not load here; see :mod:`parity_kit`). Where the two differ by
design, :data:`DIFFERENCES` asserts the difference the README lists under
"Differences from TensorDictReplayBuffer". A new call is one line in a list.
"""

from __future__ import annotations

import io
import itertools
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from parity_kit import FIELDS, SLICE_LEN, Twins, leaves, rows, same_rows

from tdreplay.client import InvalidRequest, RateLimitTimeout, SchemaError, TableNotFound

_names = itertools.count()
Step = tuple[Any, ...]


# ---------------------------------------------------------------- the calls, on both buffers
def counts(tw: Twins) -> None:
    assert len(tw.ours) == len(tw.theirs)
    assert tw.ours.write_count == tw.theirs.write_count


def extend(tw: Twins, n: int) -> None:
    """``extend`` ``n`` new rows: the same slots; the caller's TensorDict left alike."""
    data = tw.fresh(n)
    mine, theirs = data.clone(), data.clone()
    a, b = tw.ours.extend(mine), tw.theirs.extend(theirs)
    assert a.dtype == b.dtype and a.tolist() == b.tolist()
    assert set(mine.keys(True)) == set(theirs.keys(True)) == set(data.keys(True))
    assert (mine == data).all()
    if tw.priorities is not None:
        tw.priorities.written(b)
    counts(tw)


def add(tw: Twins) -> None:
    """``add`` one step (a TensorDict with no batch dims): the same slot."""
    step = tw.fresh(1)[0]
    assert tw.ours.add(step.clone()) == tw.theirs.add(step.clone())
    if tw.priorities is not None:
        tw.priorities.written(torch.tensor([len(tw.theirs) - 1]))  # not wrapped where used
    counts(tw)


def items(tw: Twins, index: Any) -> None:
    """``rb[index]``: the same rows."""
    at = torch.tensor(index) if isinstance(index, list) else index
    same_rows(tw.ours[at], tw.theirs[at], FIELDS)


def sample(tw: Twins, n: int) -> None:
    """``sample(n)``: the same keys, dtypes and shapes; every row one held now, at its slot."""
    a, b = tw.ours.sample(n), tw.theirs.sample(n)
    assert a.batch_size == b.batch_size == (n,)
    ours, theirs = leaves(a), leaves(b)
    slices = tw.kind.startswith("slice")
    for key, (dtype, shape) in theirs.items():
        assert key in ours, f"{key!r} missing from TDReplayBuffer's sample"
        if key == "index" and slices:  # documented: TorchRL's slice index is [n, 1]
            assert shape == (n, 1) and ours[key] == (dtype, (n,))
        else:
            assert ours[key] == (dtype, shape), key
    extra = {k for k in ours if k not in theirs}
    documented = {k for k in extra if isinstance(k, tuple) and k[0] == "sample_info"}
    if tw.kind == "prioritized":
        documented.add("priority_weight")  # TorchRL's twin samples uniformly here
    assert extra == documented, extra - documented
    held = tw.held()
    marked = [("next", "done")] if slices else []
    for batch in (a, b):
        index = batch["index"].reshape(n, -1)[:, 0]
        for k, i in enumerate(batch["id"].tolist()):
            assert i in held, f"sampled id {i} is not held"
            slot, row = held[i]
            assert int(index[k]) == slot
            same_rows(batch[k], row, [f for f in FIELDS if f not in marked])
        if slices:
            check_slices(batch, held)
    if slices:  # the same markers (done: as stored, or-ed with them; see check_slices)
        for key in (("next", "truncated"), ("next", "terminated")):
            assert torch.equal(a[key], b[key]), key
    if tw.priorities is not None:
        index = a["index"]
        expected = torch.tensor([tw.priorities.priority[s] for s in index.tolist()])
        assert torch.allclose(a["sample_info", "priority"], expected.float())
        weight = tw.priorities.weight(index).float()
        assert torch.allclose(a["priority_weight"], weight, rtol=1e-4)
        if "priority_weight" in b.keys():  # noqa: SIM118  (TorchRL's own sampler ran)
            assert torch.allclose(b["priority_weight"], tw.priorities.weight(b["index"]).float())


def sample_with_info(tw: Twins, n: int) -> None:
    """``sample(n, return_info=True)``: the same info keys (slices: their markers, as sampled)."""
    (a, ours), (b, theirs) = tw.ours.sample(n, True), tw.theirs.sample(n, True)
    documented = {"priority_weight"} if tw.kind == "prioritized" else set()
    assert set(ours) == set(theirs) | documented
    for key, value in ours.items():
        assert torch.equal(value, a[key]), key
        if key in theirs and key != "index":
            assert value.shape == theirs[key].shape and value.dtype == theirs[key].dtype, key
    index = theirs["index"]
    if isinstance(index, tuple):  # documented: TorchRL's slice info holds a tuple of one index
        assert tw.kind.startswith("slice") and len(index) == 1
        index = index[0]
    assert torch.equal(index.reshape(-1), b["index"].reshape(n, -1)[:, 0])


def check_slices(batch: Any, held: dict[int, Any]) -> None:
    """Slices of ``SLICE_LEN`` consecutive steps of one episode, marked as TorchRL marks them."""
    ids = batch["id"].reshape(-1, SLICE_LEN)
    assert (ids.diff(dim=1) == 1).all(), ids
    assert (batch["traj"].reshape(-1, SLICE_LEN) == batch["traj"][::SLICE_LEN, None]).all()
    ends = torch.zeros(ids.shape, dtype=torch.bool)
    ends[:, -1] = True
    assert torch.equal(batch["next", "truncated"].reshape(ids.shape), ends)
    stored = torch.stack([held[i][1]["next", "done"] for i in batch["id"].tolist()])
    assert torch.equal(batch["next", "done"], stored | batch["next", "truncated"])
    assert not batch["next", "terminated"].any()  # not stored: false, as TorchRL's


def update_priority(tw: Twins, slots: list[int], values: list[float]) -> None:
    index, priority = torch.tensor(slots), torch.tensor(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no priorities: both warn (see DIFFERENCES)
        tw.theirs.update_priority(index, priority)
        tw.ours.update_priority(index, priority)
    if tw.priorities is not None:
        tw.priorities.update(index, priority)


def update_tensordict_priority(tw: Twins, n: int) -> None:
    """A loss's ``td_error`` sent back; per slot, so a slot sampled twice gets one value."""
    for rb in (tw.ours, tw.theirs):
        batch = rb.sample(n)
        slots = batch["index"].reshape(n, -1)[:, 0]
        batch.set("td_error", 0.5 + 0.25 * slots.float())
        rb.update_tensordict_priority(batch)
        if rb is tw.ours and tw.priorities is not None:
            tw.priorities.update(slots, 0.5 + 0.25 * slots.float())


def empty(tw: Twins) -> None:
    tw.ours.empty()
    tw.theirs.empty()
    if tw.priorities is not None:
        tw.priorities.priority.clear()
        tw.priorities.top = 1.0
    counts(tw)


def state_dict_round_trip(tw: Twins) -> None:
    """``state_dict`` through ``torch.save``; more rows; ``load_state_dict``: as saved."""
    saved = []
    for rb, weights_only in ((tw.ours, True), (tw.theirs, False)):
        f = io.BytesIO()
        torch.save(rb.state_dict(), f)
        saved.append((f, weights_only))
    before = dict(tw.priorities.priority) if tw.priorities is not None else None
    extend(tw, 3)
    for rb, (f, weights_only) in zip((tw.ours, tw.theirs), saved, strict=True):
        f.seek(0)
        rb.load_state_dict(torch.load(f, weights_only=weights_only))
    if tw.priorities is not None and before is not None:
        tw.priorities.priority = before
    counts(tw)
    items(tw, slice(None))


def raises(tw: Twins, call: Callable[[Any], Any], family: type[Exception]) -> None:
    """The same call fails on both, with exceptions of one family."""
    for rb in (tw.ours, tw.theirs):
        with pytest.raises(family):
            call(rb)


# ---------------------------------------------------------------- the steps of each table kind
RING: list[Step] = [  # capacity 8
    (counts,),  # 0 and 0 before the first write (a lazy storage; ours: before create=)
    (extend, 5),
    (add,),
    (items, 0),
    (items, -1),
    (items, slice(1, 4)),
    (items, [5, 0, 5]),
    (sample, 4),
    (extend, 7),  # past the capacity: the ring wraps, the oldest go first
    (items, slice(None)),
    (sample, 8),
    (sample, 20),  # more than the capacity: with replacement
    (sample_with_info, 5),
    (extend, 13),  # more than the capacity in one call: the newest 8 stay
    (items, slice(None)),
    (raises, lambda rb: rb[8], IndexError),
    (raises, lambda rb: rb[-9], IndexError),
    (raises, lambda rb: rb.sample(), RuntimeError),  # no batch_size here nor at construction
]
UNIFORM: list[Step] = [
    *RING,
    (state_dict_round_trip,),
    (update_priority, [0], [2.0]),  # no priorities: nothing happens (a warning) on both
    (update_tensordict_priority, 4),  # likewise, silently
    (sample, 6),
    (empty,),
    (extend, 3),
    (items, slice(None)),
    (sample, 3),
]
PRIORITIZED: list[Step] = [
    *RING,
    (update_priority, [0, 3, 7], [4.0, 0.25, 2.0]),
    (sample, 16),
    (update_tensordict_priority, 8),
    (sample, 16),
    (extend, 2),  # the new items get the largest priority ever set
    (sample, 16),
    (state_dict_round_trip,),
    (sample, 16),
    (empty,),
    (extend, 4),  # back to priority 1
    (sample, 8),
]
SLICES: list[Step] = [  # capacity 16, episodes of 5 steps, slices of 4
    (counts,),
    (extend, 6),
    (extend, 7),
    (items, slice(None)),
    (sample, 8),
    (sample_with_info, 8),
    (extend, 10),  # wraps: one episode now crosses the ring's end
    (items, slice(None)),
    (sample, 8),
    (state_dict_round_trip,),
    (sample, 8),
    (raises, lambda rb: rb[16], IndexError),
    (empty,),
    (extend, 10),
    (sample, 8),
]
STEPS: dict[str, tuple[int, list[Step]]] = {
    "uniform": (8, UNIFORM),
    "prioritized": (8, PRIORITIZED),
    "slice": (16, SLICES),  # TorchRL's SliceSampler(num_slices=2): slices of 8 / 2
    "slice_len": (16, [*SLICES, (sample, 40)]),  # SliceSampler(slice_len=4): 40 > capacity
}


@pytest.mark.parametrize("transport", ["http", "shm"])
@pytest.mark.parametrize("kind", list(STEPS))
def test_same_calls_same_results(server: Any, kind: str, transport: str) -> None:
    capacity, steps = STEPS[kind]
    name = f"parity_{kind}_{next(_names)}"
    with Twins.make(kind, server.url, name, capacity, transport) as tw:
        assert tw.ours.replay_client.transport == transport
        for number, (check, *args) in enumerate(steps):
            try:
                check(tw, *args)
            except AssertionError as e:
                raise AssertionError(f"step {number} {check.__name__}{tuple(args)}: {e}") from e


# ---------------------------------------------------------------- differences by design
def _missing_key(tw: Twins) -> None:
    """``extend`` without a key the buffer holds: TorchRL writes the rest (the old values
    stay in that key's slots); the table refuses the batch before writing anything."""
    tw.theirs.extend(rows(0, 4))
    tw.ours.extend(rows(0, 4))
    tw.theirs.extend(rows(4, 2).exclude("observation"))
    with pytest.raises(SchemaError, match="observation"):
        tw.ours.extend(rows(4, 2).exclude("observation"))
    assert (len(tw.ours), len(tw.theirs)) == (4, 6)


def _wrong_dtype(tw: Twins) -> None:
    """A key of another dtype: TorchRL's ``RuntimeError`` from ``index_put``; the table's
    ``SchemaError`` (a ``ValueError``) names the key."""
    tw.theirs.extend(rows(0, 4))
    tw.ours.extend(rows(0, 4))
    bad = rows(4, 2).set("observation", torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        tw.theirs.extend(bad.clone())
    with pytest.raises(SchemaError, match="observation"):
        tw.ours.extend(bad.clone())


def _new_key_later(tw: Twins) -> None:
    """A key the first batch did not have: TorchRL's lazy storage grows it; the table's
    fields were fixed when it was made, so the key is left out with a warning naming it
    (``strict=True``: refused)."""
    tw.theirs.extend(rows(0, 4))
    tw.ours.extend(rows(0, 4))
    more = rows(4, 2).set("extra", torch.ones(2))
    tw.theirs.extend(more.clone())
    with pytest.warns(UserWarning, match=r"does not declare \['extra'\]"):
        tw.ours.extend(more.clone())
    assert "extra" in tw.theirs[:].keys() and "extra" not in tw.ours[:].keys()  # noqa: SIM118


def _not_a_tensordict(tw: Twins) -> None:
    """A dict: TorchRL's ``ValueError``, ours a ``TypeError`` (both name the types taken)."""
    with pytest.raises(ValueError, match="TensorDictBase"):
        tw.theirs.extend({"id": torch.arange(2)})
    with pytest.raises(TypeError, match="TensorDict or a tensorclass"):
        tw.ours.extend({"id": torch.arange(2)})


def _sample_nothing_held(tw: Twins) -> None:
    """Sampling before any write: TorchRL raises at once; the table does not exist yet
    (``create=`` makes it on the first extend): ``TableNotFound``. Once it exists but is
    empty, a sample waits for rows (other processes write them) up to ``timeout``."""
    with pytest.raises(RuntimeError, match="empty storage"):
        tw.theirs.sample(2)
    with pytest.raises(TableNotFound):
        tw.ours.sample(2)
    tw.ours.extend(rows(0, 2))
    tw.ours.empty()
    tw.ours._timeout = 0.2
    with pytest.raises(RateLimitTimeout):
        tw.ours.sample(2)


def _sample_zero(tw: Twins) -> None:
    """``sample(0)``: TorchRL returns an empty batch; the server refuses a batch of 0."""
    tw.theirs.extend(rows(0, 4))
    tw.ours.extend(rows(0, 4))
    assert tw.theirs.sample(0).batch_size == (0,)
    with pytest.raises(InvalidRequest, match="batch_size"):
        tw.ours.sample(0)


def _batch_of_envs(tw: Twins) -> None:
    """A ``[B, T]`` batch: the table's rows are steps, so it stores ``B * T`` rows (and
    returns their slots shaped ``[B, T]``); ``LazyTensorStorage(N)`` stores ``B`` items of
    ``T`` steps (``ndim=2`` stores ``B * T`` steps, indexed in 2-D)."""
    data = rows(0, 8).reshape(2, 4)
    assert tw.theirs.extend(data.clone()).tolist() == [0, 1]
    assert tw.ours.extend(data.clone()).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (len(tw.ours), len(tw.theirs)) == (8, 2)


def _update_priority_without_priorities(tw: Twins) -> None:
    """On a table with no priorities, both warn and do nothing; TorchRL returns ``None``,
    ours how many priorities were applied (0)."""
    for rb in (tw.ours, tw.theirs):
        rb.extend(rows(0, 2))
    with pytest.warns(UserWarning):
        assert tw.theirs.update_priority(torch.tensor([0]), torch.tensor([1.0])) is None
    with pytest.warns(UserWarning, match="keeps no priorities"):
        assert tw.ours.update_priority(torch.tensor([0]), torch.tensor([1.0])) == 0


def _slice_batch_not_whole_slices(tw: Twins) -> None:
    """A slice sample not a whole number of slices: TorchRL's ``RuntimeError``; the
    server's ``InvalidRequest`` (a ``ValueError``) names ``slice_len``."""
    for rb in (tw.ours, tw.theirs):
        rb.extend(rows(0, 10))
    with pytest.raises(RuntimeError, match="divisible"):
        tw.theirs.sample(7)
    with pytest.raises(InvalidRequest, match="slice_len"):
        tw.ours.sample(7)


DIFFERENCES: list[tuple[str, Callable[[Twins], None]]] = [
    ("uniform", _missing_key),
    ("uniform", _wrong_dtype),
    ("uniform", _new_key_later),
    ("uniform", _not_a_tensordict),
    ("uniform", _sample_nothing_held),
    ("uniform", _sample_zero),
    ("uniform", _batch_of_envs),
    ("uniform", _update_priority_without_priorities),
    ("slice", _slice_batch_not_whole_slices),
]


@pytest.mark.parametrize(("kind", "case"), DIFFERENCES, ids=[c.__name__ for _, c in DIFFERENCES])
def test_documented_differences(server: Any, kind: str, case: Callable[[Twins], None]) -> None:
    with Twins.make(kind, server.url, f"parity_diff_{next(_names)}", STEPS[kind][0]) as tw:
        case(tw)
