"""Helpers for the client tests: unique table names, the shipped schemas' fields, random rows."""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import Any

import torch
import yaml
from tensordict import TensorDict

REPO = Path(__file__).resolve().parents[2]

_names = itertools.count()


def unique(prefix: str) -> str:
    """A table name no other test (or test process) uses."""
    return f"{prefix}_{os.getpid()}_{next(_names)}"


def schema_fields(name: str) -> dict[str, Any]:
    """The ``fields`` of a shipped schema (schemas/{name}.yaml)."""
    return yaml.safe_load((REPO / "schemas" / f"{name}.yaml").read_text())["fields"]


def make_rows(fields: dict[str, Any], n: int, *, seed: int = 0) -> TensorDict:
    """``n`` random rows for ``fields`` (every dtype, no NaN), batch ``[n]``."""
    g = torch.Generator().manual_seed(seed)
    td = TensorDict(batch_size=[n])
    for name, f in fields.items():
        shape = [n, *f["shape"]]
        dtype = getattr(torch, f["dtype"])
        if dtype == torch.bool:
            t = torch.rand(shape, generator=g) < 0.5
        elif dtype.is_floating_point:
            t = torch.randn(shape, generator=g).to(dtype)
        else:
            info = torch.iinfo(dtype)
            lo, hi = max(info.min, -(2**31)), min(info.max, 2**31 - 1)
            t = torch.randint(lo, hi, shape, generator=g, dtype=torch.int64).to(dtype)
        td.set(tuple(name.split(".")), t)
    return td
