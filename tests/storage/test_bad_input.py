"""Bad input is rejected with a message naming the key, and changes nothing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from storage_helpers import assert_same, snapshot
from tensordict import TensorDict
from testkit import make_spec, rows

from tdreplay.storage import InvalidRequest, SchemaError


def _missing(td: TensorDict) -> TensorDict:
    return td.exclude("pixels")


def _missing_nested(td: TensorDict) -> TensorDict:
    return td.exclude(("next", "reward"))


def _extra(td: TensorDict) -> TensorDict:
    td["extra"] = torch.zeros(len(td))
    return td


def _extra_nested(td: TensorDict) -> TensorDict:
    td["next", "extra"] = torch.zeros(len(td), 1)
    return td


def _shape(td: TensorDict) -> TensorDict:
    td["observation"] = torch.zeros(len(td), 4)
    return td


def _scalar_for_vector(td: TensorDict) -> TensorDict:
    td["next", "reward"] = torch.zeros(len(td), dtype=torch.float16)
    return td


def _dtype(td: TensorDict) -> TensorDict:
    td["observation"] = td["observation"].double()
    return td


def _dtype_bf16_as_f16(td: TensorDict) -> TensorDict:
    td["action"] = td["action"].half()
    return td


def _no_batch_dims(td: TensorDict) -> TensorDict:
    return TensorDict(td.to_dict(), batch_size=[])


def _two_batch_dims(td: TensorDict) -> TensorDict:
    return td.reshape(len(td), 1) if len(td) > 1 else td.unsqueeze(0)


def _zero_rows(td: TensorDict) -> TensorDict:
    return rows(0, 0)


def _over_capacity(td: TensorDict) -> TensorDict:
    return rows(0, 17)


def _non_tensor_leaf(td: TensorDict) -> TensorDict:
    td = td.exclude("pixels")
    td.set_non_tensor("pixels", "not pixels")
    return td


def _extra_non_tensor_leaf(td: TensorDict) -> TensorDict:
    td.set_non_tensor("note", "hello")
    return td


def _plain_dict(td: TensorDict) -> dict:
    return td.to_dict()


# (case, make the bad batch from a good one of 3 rows, error, field, words in the message)
EXTEND_CASES: list[tuple[str, Callable, type, str | None, list[str]]] = [
    ("missing-key", _missing, SchemaError, "pixels", ["missing key 'pixels'"]),
    ("missing-nested-key", _missing_nested, SchemaError, "next.reward", ["'next.reward'"]),
    ("extra-key", _extra, SchemaError, "extra", ["unexpected key 'extra'"]),
    ("extra-nested-key", _extra_nested, SchemaError, "next.extra", ["'next.extra'"]),
    ("wrong-shape", _shape, SchemaError, "observation", ["[3, 4]", "expected [3, 3]"]),
    ("wrong-shape-scalar", _scalar_for_vector, SchemaError, "next.reward", ["[3]", "[3, 1]"]),
    ("wrong-dtype", _dtype, SchemaError, "observation", ["float64", "expected float32"]),
    ("wrong-dtype-half", _dtype_bf16_as_f16, SchemaError, "action", ["float16", "bfloat16"]),
    ("no-batch-dims", _no_batch_dims, SchemaError, "batch_size", ["batch_size []"]),
    ("two-batch-dims", _two_batch_dims, SchemaError, "batch_size", ["batch_size [3, 1]"]),
    ("zero-rows", _zero_rows, InvalidRequest, "batch_size", ["no rows"]),
    ("over-capacity", _over_capacity, InvalidRequest, "batch_size", ["17 rows", "capacity 16"]),
    ("non-tensor-leaf", _non_tensor_leaf, SchemaError, "pixels", ["'pixels'", "not a tensor"]),
    ("extra-non-tensor", _extra_non_tensor_leaf, SchemaError, "note", ["'note'"]),
    ("plain-dict", _plain_dict, SchemaError, None, ["takes a TensorDict", "dict"]),
]


@pytest.mark.parametrize(
    ("make_bad", "error", "field", "words"),
    [c[1:] for c in EXTEND_CASES],
    ids=[c[0] for c in EXTEND_CASES],
)
def test_bad_extend_is_rejected_and_changes_nothing(
    backend: dict, tables, make_bad: Callable, error: type, field: str | None, words: list[str]
) -> None:
    table = tables.create(make_spec(capacity=16, backend=backend))
    table.extend(rows(0, 14))
    table.sample(4)
    before = snapshot(table)
    with pytest.raises(error) as info:
        table.extend(make_bad(rows(100, 3)))
    message = str(info.value)
    assert message.startswith("table 't': "), message
    for word in words:
        assert word in message, (word, message)
    assert info.value.field == field
    assert info.value.table == "t"
    assert_same(before, snapshot(table))
    # and the table still works: the next good extend lands where the cursor was
    assert table.extend(rows(14, 3)).tolist() == [14, 15, 0]


PRIORITY_CASES = [
    ("negative", "prioritized", [1.0, -1.0, 1.0], ["finite and >= 0"]),
    ("nan", "prioritized", [1.0, float("nan"), 1.0], ["finite and >= 0"]),
    ("inf", "prioritized", [float("inf"), 1.0, 1.0], ["finite and >= 0"]),
    ("too-few", "prioritized", [1.0, 1.0], ["2 priorities for 3 rows"]),
    ("not-prioritized", "uniform", [1.0, 1.0, 1.0], ["priorities", "'uniform'"]),
]


@pytest.mark.parametrize(
    ("sampler", "priority", "words"),
    [c[1:] for c in PRIORITY_CASES],
    ids=[c[0] for c in PRIORITY_CASES],
)
def test_bad_extend_priorities_change_nothing(
    tables, sampler: str, priority: list[float], words: list[str]
) -> None:
    table = tables.create(make_spec(capacity=16, sampler={"kind": sampler}))
    table.extend(rows(0, 5))
    before = snapshot(table)
    with pytest.raises(InvalidRequest) as info:
        table.extend(rows(5, 3), priority=torch.tensor(priority))
    for word in words:
        assert word in str(info.value)
    assert info.value.field == "priority"
    assert_same(before, snapshot(table))


def _wrong_batch(batch: TensorDict) -> TensorDict:
    return batch[:4].clone()


def _wrong_dtype(batch: TensorDict) -> TensorDict:
    batch["observation"] = batch["observation"].double()
    return batch


def _wrong_shape(batch: TensorDict) -> TensorDict:
    batch["pixels"] = torch.zeros(8, 2, 3, dtype=torch.uint8)
    return batch


def _missing_out_key(batch: TensorDict) -> TensorDict:
    return batch.exclude("observation")


def _non_contiguous(batch: TensorDict) -> TensorDict:
    batch["observation"] = torch.zeros(3, 8).T
    return batch


OUT_CASES = [
    ("batch-size", _wrong_batch, "out", ["batch_size [4]", "expected [8]"]),
    ("dtype", _wrong_dtype, "observation", ["out['observation']", "float32"]),
    ("shape", _wrong_shape, "pixels", ["out['pixels']", "[8, 2, 2]"]),
    ("missing-key", _missing_out_key, "observation", ["out['observation']"]),
    ("non-contiguous", _non_contiguous, "observation", ["contiguous"]),
]


@pytest.mark.parametrize(
    ("make_bad", "field", "words"), [c[1:] for c in OUT_CASES], ids=[c[0] for c in OUT_CASES]
)
def test_bad_out_is_rejected_and_changes_nothing(
    backend: dict, tables, make_bad: Callable, field: str, words: list[str]
) -> None:
    table = tables.create(make_spec(capacity=16, backend=backend))
    table.extend(rows(0, 16))
    out = make_bad(table.sample(8))
    kept = out.clone()
    before = snapshot(table)
    with pytest.raises(InvalidRequest) as info:
        table.sample(8, out=out)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    assert info.value.field == field
    assert_same(before, snapshot(table))
    assert (out == kept).all()  # not half-written either


@pytest.mark.parametrize("batch_size", [0, -1, 17, 2.5, "8", None])
def test_bad_batch_size_is_rejected_and_changes_nothing(backend: dict, tables, batch_size) -> None:
    table = tables.create(make_spec(capacity=16, backend=backend))
    table.extend(rows(0, 10))
    before = snapshot(table)
    with pytest.raises(InvalidRequest, match=r"batch_size must be an integer in \[1, 16\]") as info:
        table.sample(batch_size)
    assert info.value.field == "batch_size"
    assert_same(before, snapshot(table))


def test_rejected_sample_leaves_the_generator_alone(tables) -> None:
    a = tables.create(make_spec(name="a", capacity=16), seed=3)
    b = tables.create(make_spec(name="b", capacity=16), seed=3)
    for t in (a, b):
        t.extend(rows(0, 16))
    with pytest.raises(InvalidRequest):
        a.sample(0)
    with pytest.raises(InvalidRequest):
        a.sample(8, out=rows(0, 8).exclude("id"))
    assert torch.equal(a.sample(8)["index"], b.sample(8)["index"])


def test_extend_copies_the_input(tables) -> None:
    """Changing the caller's tensors after extend does not change the table."""
    table = tables.create(make_spec(capacity=8))
    data = rows(0, 4)
    table.extend(data)
    data["observation"].fill_(-1)
    assert table.read(torch.arange(4))["observation"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]


def _set(key: tuple[str, ...], make: Callable[[torch.Tensor], torch.Tensor]) -> Callable:
    def change(batch: TensorDict) -> TensorDict:
        batch.set(key, make(batch.get(key)))
        return batch

    return change


INFO_CASES = [
    ("key-float32", _set(("sample_info", "key"), lambda t: t.float()), "sample_info.key"),
    ("times-int32", _set(("sample_info", "times_sampled"), lambda t: t.int()), "sample_info.times_sampled"),
    ("priority-int64", _set(("sample_info", "priority"), lambda t: t.long()), "sample_info.priority"),
    ("weight-column", _set(("sample_info", "weight"), lambda t: t[:, None].clone()), "sample_info.weight"),
    ("index-bool", _set(("index",), lambda t: t.bool()), "index"),
    ("weight-grad", _set(("sample_info", "weight"), lambda t: t.clone().requires_grad_()), "sample_info.weight"),
]  # fmt: skip


@pytest.mark.parametrize("checked", [False, True], ids=["out", "target"])
@pytest.mark.parametrize(
    ("make_bad", "field"), [c[1:] for c in INFO_CASES], ids=[c[0] for c in INFO_CASES]
)
def test_bad_sample_info_in_out_is_rejected_and_changes_nothing(
    tables, make_bad: Callable, field: str, checked: bool
) -> None:
    """A sample writes ``out``'s sample-info tensors in place, a few items one by one
    through their memory: one of another dtype or shape is refused before anything is
    drawn (a float32 key was silently rounded, an int64 priority or an [n, 1] weight
    failed after a queue had handed its items out: lost), both as ``out=`` and as a
    checked target."""
    table = tables.create(make_spec(capacity=16, sampler={"kind": "fifo"}))
    table.extend(rows(0, 12))
    out = make_bad(table.sample(3).detach().clone())
    before = snapshot(table)
    with pytest.raises(InvalidRequest) as info:
        table.sample(3, out=table.target(out, 3) if checked else out)
    assert info.value.field == field
    assert f"out[{field!r}]" in str(info.value) and "got" in str(info.value)
    assert_same(before, snapshot(table))
    assert table.sample(9)["id"].tolist() == list(range(3, 12))  # nothing handed out


@pytest.mark.parametrize(
    ("shape", "n", "bad"),
    [([], 2, 2), ([], 2, -1), ([3], 4, 4), ([3], 4, -7)],
    ids=["scalar-high", "scalar-negative", "multi-high", "multi-negative"],
)
def test_a_value_outside_a_fields_categories_is_refused_and_changes_nothing(
    backend: dict, tables, shape: list[int], n: int, bad: int
) -> None:
    """A field declaring ``n`` categories holds values ``0 .. n-1``: an extend holding
    another is refused naming the field and the value, before anything is written; the
    edges themselves go in."""
    spec = make_spec(
        capacity=16, backend=backend, fields={"choice": {"shape": shape, "dtype": "int16", "n": n}}
    )
    table = tables.create(spec)

    def with_choice(td: TensorDict, value: int | None = None) -> TensorDict:
        edges = torch.arange(len(td)) % n  # every category, the edges included
        choice = edges.reshape(-1, *[1] * len(shape)).expand(len(td), *shape).to(torch.int16)
        td["choice"] = choice.clone()
        if value is not None:
            td["choice"].view(-1)[-1] = value  # one element of the last row
        return td

    table.extend(with_choice(rows(0, 12)))
    assert table.read(torch.arange(12))["choice"].max() == n - 1
    before = snapshot(table)
    with pytest.raises(InvalidRequest) as info:
        table.extend(with_choice(rows(100, 3), bad))
    assert info.value.field == "choice" and info.value.got == bad
    assert f"holds {bad}, outside its {n} categories 0 .. {n - 1}" in str(info.value)
    assert_same(before, snapshot(table))


@pytest.mark.parametrize("call", ["update_priority", "remove", "read"])
@pytest.mark.parametrize(
    "index",
    [[0.5], [True], torch.tensor([1.0, 2.0]), [0, True], np.array([1.5])],
    ids=["half", "bool", "floats", "bool-among-ints", "float-array"],
)
def test_a_slot_that_is_no_integer_is_refused_and_changes_nothing(
    tables, call: str, index: object
) -> None:
    """In process, 0.5 named slot 0 and True slot 1 (cast to int64): the wrong item's
    priority changed, or the wrong item was removed. The wire always refused them."""
    table = tables.create(make_spec(capacity=16, sampler={"kind": "prioritized"}))
    table.extend(rows(0, 5))
    before = snapshot(table)
    with pytest.raises(InvalidRequest, match="index must be integers") as info:
        if call == "update_priority":
            table.update_priority(index, torch.ones(len(torch.as_tensor(index))))
        else:
            getattr(table, call)(index)
    assert info.value.field == "index" and info.value.table == "t"
    assert_same(before, snapshot(table))


@pytest.mark.parametrize(
    "key",
    [[0.5, 1], [True, 1], [1, True], [-1, 1], [1, 2**63]],
    ids=["half", "bool", "bool-after-an-int", "negative", "past-int64"],
)
def test_a_key_the_wire_refuses_is_refused_in_process_too(tables, key: list[object]) -> None:
    """Slots and keys follow one rule in process and over the wire (the contract's
    ``SlotIndex``): ``[1, True]`` became int64 ``[1, 1]`` in process, a negative key was
    taken (and matched nothing), and 2**63 was a RuntimeError rather than the error naming
    the key; the wire refused all of them, naming ``key``."""
    table = tables.create(make_spec(capacity=16, sampler={"kind": "prioritized"}))
    table.extend(rows(0, 5))
    before = snapshot(table)
    for call in (
        lambda: table.update_priority([0, 1], torch.ones(2), key=key),
        lambda: table.remove([0, 1], key=key),
    ):
        with pytest.raises(InvalidRequest) as info:
            call()
        assert info.value.field == "key" and info.value.table == "t", str(info.value)
    assert_same(before, snapshot(table))
