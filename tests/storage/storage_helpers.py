"""Helpers shared by the storage tests: bit-exact comparisons and table snapshots."""

from __future__ import annotations

import copy
from typing import Any

import torch
from tensordict import TensorDictBase

from tdreplay.storage import Table


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of ``t`` (so NaNs, -0.0 and bfloat16 compare exactly)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    return t.reshape(-1).view(torch.uint8)


def assert_bitwise_equal(a: TensorDictBase, b: TensorDictBase, keys: Any = None) -> None:
    """Every leaf of ``a`` (or just ``keys``) equals the same leaf of ``b`` bit for bit."""
    keys = list(keys) if keys is not None else list(a.keys(True, True))
    assert keys, "nothing to compare"
    for key in keys:
        x, y = a.get(key), b.get(key)
        assert x.dtype == y.dtype, (key, x.dtype, y.dtype)
        assert x.shape == y.shape, (key, x.shape, y.shape)
        assert torch.equal(bits(x), bits(y)), f"{key} differs"


def all_rows(table: Table) -> dict:
    """Every row of the storage (written or not), as raw bytes per field."""
    got = table.backend.read(torch.arange(table.capacity, dtype=torch.int64))
    return {k: bits(v) for k, v in got.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return copy.deepcopy(value)


def snapshot(table: Table) -> dict:
    """Everything a rejected call must leave unchanged: data, size, counters, cursors, RNG."""
    return {
        "rows": all_rows(table),
        "size": len(table),
        "inserts": table.rate_limiter.inserts,
        "samples": table.rate_limiter.samples,
        "bytes_in": table.bytes_in,
        "bytes_out": table.bytes_out,
        "state": _plain(table.state_dict()),
        "busy": table.slots.busy.clone(),
    }


def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Deep equality of snapshots (tensors compared exactly)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(bits(a), bits(b)), f"{where} changed"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}" if where else str(k))
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"
