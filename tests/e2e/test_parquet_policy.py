"""One Parquet import policy, two doors: the same file through ``Table.import_parquet`` (the
table's own import) and through a real server with ``ReplayClient.import_parquet`` (read in
the client, sent as extends) gets the same answer -- the same rows, or the same
``SchemaError`` (type, field, message naming the column and the file) with nothing
written. The policy is ``tdreplay.codec.parquet_import``'s; the cases walk it: extra
columns, casts (lossless, float rounding, overflow, lossy), mappings, missing columns,
nulls found late in a file, files without statistics."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from testkit import run_cli as cli
from testkit import unique

from tdreplay.client import ReplayClient
from tdreplay.storage import SchemaError, TableSpec

FIELDS: dict[str, Any] = {
    "observation": {"shape": [3], "dtype": "float32"},
    "action": {"shape": [2], "dtype": "int64"},
    "next.reward": {"shape": [1], "dtype": "float32"},
}
N = 10


def columns(n: int = N, **change: Any) -> dict[str, Any]:
    """A file's columns as another tool writes them: float64 and int32 lists, a flat
    ``next.reward``; ``change`` replaces (or, given ``None``, removes) columns."""
    cols: dict[str, Any] = {
        "observation": pa.array([[i + 0.1, -i / 3, 1e-3 * i] for i in range(n)]),  # double
        "action": pa.array([[i, -i] for i in range(n)], pa.list_(pa.int32())),
        "next.reward": pa.array([0.1 * i for i in range(n)]),  # double scalars for [1]
    }
    cols.update(change)
    return {k: v for k, v in cols.items() if v is not None}


def _late_null() -> pa.Array:
    return pa.array([*(0.5 * i for i in range(N - 1)), None])  # in the last row group


def _overflow() -> pa.Array:
    obs = [[float(i), 0.0, 0.0] for i in range(N)]
    obs[7][2] = 1e39
    return pa.array(obs)


#: name -> (the file's columns, import keyword arguments, None: accepted, else the error's regex)
CASES: dict[str, tuple[Callable[[], dict[str, Any]], dict[str, Any], str | None]] = {
    "float64 rounded into float32, int32 widened": (columns, {}, None),
    "extra columns refused": (
        lambda: columns(note=pa.array(["x"] * N), seed=pa.array([1] * N)),
        {},
        r"columns 'note', 'seed' of '.*' are not fields of the table; .*ignore_extra=True",
    ),
    "extra columns ignored on request": (
        lambda: columns(note=pa.array(["x"] * N)),
        {"ignore_extra": True},
        None,
    ),
    "pandas index skipped": (lambda: columns(__index_level_0__=pa.array(range(N))), {}, None),
    "float overflow refused": (
        lambda: columns(observation=_overflow()),
        {},
        r"column 'observation' of '.*' holds 1e\+39 in row 7, beyond float32's range",
    ),
    "int64 into float32 refused": (
        lambda: columns(observation=pa.array([[1, 2, 3]] * N)),
        {},
        "column 'observation' of '.*' has dtype int64, which does not cast to float32 without loss",
    ),
    "float into an integer field refused": (
        lambda: columns(action=pa.array([[1.0, 2.0]] * N)),
        {},
        "has dtype float64, which does not cast to int64 without loss",
    ),
    "mapped columns": (
        lambda: columns(obs=columns()["observation"], observation=None),
        {"columns": {"observation": "obs"}},
        None,
    ),
    "missing column": (
        lambda: columns(observation=None),
        {},
        r"no column 'observation' for field 'observation' in '.*' \(columns: action, "
        r"next.reward\)",
    ),
    "mapping names no field": (
        columns,
        {"columns": {"nope": "observation"}},
        "the mapping nope=observation names no field of the table",
    ),
    "late null refused before any row": (
        lambda: columns(**{"next.reward": _late_null()}),
        {},
        "column 'next.reward' of '.*' holds 1 null value",
    ),
    "ragged list refused": (
        lambda: columns(observation=pa.array([[1.0, 2.0, 3.0]] * (N - 1) + [[1.0]])),
        {},
        "column 'observation' of '.*' row 9 holds a list of 1 values, expected 3",
    ),
}


def _outcome(do: Callable[[], int], read: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        written = do()
    except SchemaError as err:
        return ("refused", type(err), err.field, str(err), read())
    return ("accepted", written, read())


@pytest.mark.parametrize("statistics", [True, False], ids=["stats", "no-stats"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_same_file_gets_the_same_answer_through_both_doors(
    client: ReplayClient, tables: Any, tmp_path: Path, case: str, statistics: bool
) -> None:
    build, kwargs, error = CASES[case]
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table(build()), path, row_group_size=4, write_statistics=statistics)
    name = unique("policy")  # one name for both tables: the errors name it
    client.create_table(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    spec = TableSpec.model_validate(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    table = tables.create(spec)

    def rows_of_table() -> dict[str, list]:
        return _plain(table.read(table.live_index()) if len(table) else None)

    def rows_of_server() -> dict[str, list]:
        size = client.info(name)["size"]
        return _plain(client.read(name, list(range(size))) if size else None)

    storage = _outcome(lambda: table.import_parquet(path, chunk=3, **kwargs), rows_of_table)
    remote = _outcome(lambda: client.import_parquet(name, path, chunk=3, **kwargs), rows_of_server)
    assert storage == remote
    if error is None:
        assert storage[:2] == ("accepted", N)
        got = storage[2]
        assert got["action"][3] == [3, -3]
        want = np.asarray([0.1 * i for i in range(N)], np.float64).astype(np.float32)
        assert got["next.reward"] == [[float(v)] for v in want]  # rounded to nearest
    else:
        assert storage[0] == "refused", storage
        assert storage[4] == {}, "a refused file wrote rows"
        assert re.search(error, storage[3]), storage[3]
        assert "'.*'" not in error or repr(str(path)) in storage[3]  # names the file


def _plain(td: Any) -> dict[str, list]:
    """The fields' values as lists (nothing else a read may carry), ``{}`` for no rows."""
    if td is None:
        return {}
    return {name: td[tuple(name.split("."))].tolist() for name in FIELDS}


def test_the_cli_takes_the_same_policy(
    client: ReplayClient, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``tdreplay import`` refuses extra columns as both doors do, and ``--ignore-extra``
    skips them; the refusal wrote nothing."""
    path = tmp_path / "extra.parquet"
    pq.write_table(pa.table(columns(note=pa.array(["x"] * N))), path)
    name = unique("policy")
    client.create_table(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    url = ("--url", client.urls[0])
    code, _, err = cli("import", name, str(path), *url, capsys=capsys)
    assert code == 1 and "column 'note' of" in err and "--ignore-extra" in err, err
    assert "0 rows were written" in err and client.info(name)["size"] == 0
    code, out, err = cli("import", name, str(path), "--ignore-extra", *url, capsys=capsys)
    assert code == 0 and f"imported {N} rows" in out, err
    got = client.read(name, list(range(N)))
    assert torch.equal(got["observation"][:, 0], torch.tensor([i + 0.1 for i in range(N)]))
