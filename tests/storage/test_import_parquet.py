"""Parquet into a table with ``Table.import_parquet``: the table's own exports back bit for
bit, other tools' files (plain and nested lists, struct columns, pandas), folders, and every
mismatch refused before any row is written. The policy is ``tdreplay.codec.parquet_import``'s,
the client's import follows it too (``tests/e2e/test_parquet_policy.py`` runs the same files
through both)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from storage_helpers import assert_bitwise_equal
from test_export import filled, full_spec, random_items
from testkit import PEAK, make_spec, rows

from tdreplay.storage import InvalidRequest, SchemaError, Table, TableSpec


def test_parquet_round_trip_into_a_fresh_table(backend: dict, tables, tmp_path: Path) -> None:
    table, expected = filled(tables, backend)
    path = table.export(tmp_path / "x.pq")
    fresh = tables.create(full_spec("y", backend))
    assert fresh.import_parquet(path, chunk=7) == len(expected)
    assert len(fresh) == len(expected)
    assert_bitwise_equal(expected, fresh.read(fresh.live_index()))
    # a second import wraps the ring: the file's oldest items go first
    assert fresh.import_parquet(path, chunk=1000) == len(expected)
    assert_bitwise_equal(expected, fresh.read(fresh.live_index()))


def foreign_table(n: int = 20) -> pa.Table:
    """``rows(0, n)`` as another tool would write it: no tdreplay metadata, other layouts.

    ``id`` int32 (widens to int64), ``observation`` variable lists, ``action``
    int8 lists (exact in bfloat16), ``next`` a struct column with a scalar
    float16 ``reward`` for a ``[1]`` field, ``pixels`` nested fixed-size lists.
    """
    d = rows(0, n)
    reward = pa.array(d["next", "reward"].reshape(-1).numpy())
    done = pa.array(d["next", "done"].numpy().tolist(), pa.list_(pa.bool_()))
    pixels = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(d["pixels"].reshape(-1).numpy()), 2), 2
    )
    return pa.table(
        {
            "id": pa.array(d["id"].numpy().astype(np.int32)),
            "observation": pa.array(d["observation"].numpy().tolist(), pa.list_(pa.float32())),
            "action": pa.array(d["action"].float().numpy().tolist(), pa.list_(pa.int8(), 2)),
            "next": pa.StructArray.from_arrays([reward, done], names=["reward", "done"]),
            "pixels": pixels,
        }
    )


def test_foreign_parquet_imports(tables, tmp_path: Path) -> None:
    path = tmp_path / "foreign.parquet"
    pq.write_table(foreign_table(), path, row_group_size=6)
    table = tables.create(make_spec())
    assert table.import_parquet(path, chunk=4) == 20
    assert_bitwise_equal(rows(0, 20), table.read(table.live_index()))
    # images as nested variable-size lists, [row][col], as pa.array infers them
    pixels = pa.array(rows(0, 20)["pixels"].numpy().tolist())
    assert pixels.type == pa.list_(pa.list_(pa.int64()))
    pq.write_table(
        _replace(foreign_table(), "pixels", pixels.cast(pa.list_(pa.list_(pa.uint8())))), path
    )
    fresh = tables.create(make_spec("u"))
    assert fresh.import_parquet(path) == 20
    assert_bitwise_equal(rows(0, 20), fresh.read(fresh.live_index()))


def test_pandas_parquet_imports(tables, tmp_path: Path) -> None:
    spec = TableSpec.model_validate(
        {
            "name": "p",
            "capacity": 16,
            "backend": {"kind": "memory"},
            "fields": {
                "step": {"shape": [], "dtype": "int64"},
                "obs": {"shape": [2], "dtype": "float64"},
                "next.reward": {"shape": [], "dtype": "float32"},
            },
        }
    )
    df = pd.DataFrame(
        {
            "step": [3, 4, 5],
            "obs": [np.array([0.1, 0.2]), np.array([1.5, -2.0]), np.array([np.inf, 0.0])],
            "next.reward": np.array([1.0, 0.5, -1.0], np.float32),
        },
        index=[10, 20, 30],  # written as __index_level_0__, ignored
    )
    df.to_parquet(tmp_path / "df.parquet")
    table = tables.create(spec)
    assert table.import_parquet(tmp_path / "df.parquet") == 3
    got = table.read(table.live_index())
    assert got["step"].tolist() == [3, 4, 5]
    assert torch.equal(got["obs"], torch.tensor(np.stack(df["obs"].to_list())))
    assert got["next", "reward"].tolist() == [1.0, 0.5, -1.0]


def test_import_folder_in_name_order(tables, tmp_path: Path) -> None:
    table, _ = filled(tables)
    folder = tmp_path / "ds"
    (folder / "part").mkdir(parents=True)
    table.export(folder / "b.parquet")
    src = tables.create(full_spec("src"))
    src.extend(random_items(src.spec, 100, 5))
    src.export(folder / "part" / "c.pq")
    src.export(folder / "a.parquet")
    (folder / "_SUCCESS").write_text("")
    (folder / "_metadata.parquet").write_text("not parquet")  # skipped: leading underscore
    fresh = tables.create(full_spec("y", capacity=64))
    assert fresh.import_parquet(folder, chunk=9) == 50
    assert fresh.read(fresh.live_index())["id"].tolist() == [
        *range(100, 105),
        *range(15, 55),
        *range(100, 105),
    ]


def test_import_bad_paths(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec())
    with pytest.raises(InvalidRequest, match="no such file"):
        table.import_parquet(tmp_path / "missing.parquet")
    with pytest.raises(InvalidRequest, match="no Parquet files"):
        table.import_parquet(tmp_path)
    (tmp_path / "junk.parquet").write_text("junk")
    with pytest.raises(InvalidRequest, match="not a readable Parquet file"):
        table.import_parquet(tmp_path / "junk.parquet")
    with pytest.raises(InvalidRequest, match="chunk"):
        table.import_parquet(tmp_path / "junk.parquet", chunk=0)
    table.extend(rows(0, 3))
    csv = table.export(tmp_path / "t.csv")  # a real CSV export: refused as CSV, not as junk
    with pytest.raises(InvalidRequest, match=r"'.*t\.csv' is CSV; an import reads Parquet only"):
        table.import_parquet(csv)
    assert len(table) == 3


def _replace(t: pa.Table, name: str, arr: pa.Array | None) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.remove_column(i) if arr is None else t.set_column(i, name, arr)


def _late_nulls() -> pa.Table:
    ids = foreign_table()["id"].to_pylist()
    return _replace(foreign_table(), "id", pa.array([*ids[:-1], None], pa.int32()))


def _ragged() -> pa.Table:
    obs = rows(0, 20)["observation"].numpy().tolist()
    obs[-1] = obs[-1][:2]  # the last row group holds a short list
    return _replace(foreign_table(), "observation", pa.array(obs, pa.list_(pa.float32())))


def _ragged_nested() -> pa.Table:
    pixels = rows(0, 20)["pixels"].numpy().tolist()
    pixels[-1][1] = pixels[-1][1][:1]
    return _replace(foreign_table(), "pixels", pa.array(pixels, pa.list_(pa.list_(pa.uint8()))))


def _tampered(tmp_path: Path, meta: dict) -> pa.Table:
    table = Table.create(make_spec("tmp"), root=tmp_path / "tmp")
    table.extend(rows(0, 20))
    t = pq.read_table(table.export(tmp_path / "tmp.parquet"))
    table.destroy()
    i = t.schema.get_field_index("observation")
    return t.cast(t.schema.set(i, t.schema.field(i).with_metadata(meta)))


def _overflow() -> pa.Table:
    obs = rows(0, 20)["observation"].double().numpy().tolist()
    obs[-1][1] = 1e39  # finite in float64, infinite in the float32 field
    return _replace(foreign_table(), "observation", pa.array(obs, pa.list_(pa.float64(), 3)))


MISMATCHES = {
    "missing": (
        "pixels",
        "no column 'pixels' for field 'pixels'",
        lambda p: _replace(foreign_table(), "pixels", None),
    ),
    "extra": (
        "bonus",
        "column 'bonus' of .* is not a field of the table; .* ignore_extra=True",
        lambda p: foreign_table().append_column("bonus", pa.array([1] * 20)),
    ),
    "shape": (
        "observation",
        r"has lists of 4, expected shape \[3\]",
        lambda p: _replace(
            foreign_table(), "observation", pa.array([[1.0] * 4] * 20, pa.list_(pa.float32(), 4))
        ),
    ),
    "lossy dtype": (
        "observation",
        "has dtype int64, which does not cast to float32 without loss",
        lambda p: _replace(
            foreign_table(), "observation", pa.array([[1, 2, 3]] * 20, pa.list_(pa.int64(), 3))
        ),
    ),
    "float overflow": (
        "observation",
        r"holds 1e\+39 in row 19, beyond float32's range",
        lambda p: _overflow(),
    ),
    "bfloat16 bits without metadata": (
        "action",
        "uint16, which does not cast to bfloat16 without loss",
        lambda p: _replace(
            foreign_table(), "action", pa.array([[1, 2]] * 20, pa.list_(pa.uint16(), 2))
        ),
    ),
    "string": (
        "id",
        "unsupported Arrow type string",
        lambda p: _replace(foreign_table(), "id", pa.array(["a"] * 20)),
    ),
    "late nulls": ("id", "holds 1 null value", lambda p: _late_nulls()),
    "ragged list": (
        "observation",
        "row 19 holds a list of 2 values, expected 3",
        lambda p: _ragged(),
    ),
    "ragged nested list": (
        "pixels",
        "row 19 holds a list of 1 values, expected 2",
        lambda p: _ragged_nested(),
    ),
    "metadata dtype": (
        "observation",
        "metadata dtype 'float64'",
        lambda p: _tampered(p, {b"tdreplay.dtype": b"float64", b"tdreplay.shape": b"[3]"}),
    ),
    "metadata shape": (
        "observation",
        r"has shape \[1, 3\], expected shape \[3\]",
        lambda p: _tampered(p, {b"tdreplay.dtype": b"float32", b"tdreplay.shape": b"[1, 3]"}),
    ),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatching_parquet_is_rejected_before_any_row(tables, tmp_path: Path, case: str) -> None:
    column, message, build = MISMATCHES[case]
    folder = tmp_path / "ds"
    folder.mkdir()
    # a good file first: a folder is checked as a whole before anything is written
    pq.write_table(foreign_table(), folder / "a.parquet")
    pq.write_table(build(tmp_path), folder / "b.parquet", row_group_size=6)
    table = tables.create(make_spec())
    for path in (folder / "b.parquet", folder):
        with pytest.raises(SchemaError, match=message) as err:
            table.import_parquet(path, chunk=4)
        assert err.value.field == column
        assert "b.parquet" in str(err.value)
        assert len(table) == 0 and table.rate_limiter.inserts == 0


def _bad_id() -> pa.Table:
    return _replace(foreign_table(), "id", pa.array([*range(19), 20], pa.int32()))


def _nan_reward() -> pa.Table:
    reward = pa.array([*[0.5] * 19, float("nan")], pa.float16())
    done = foreign_table()["next"].combine_chunks().field("done")
    return _replace(
        foreign_table(), "next", pa.StructArray.from_arrays([reward, done], ["reward", "done"])
    )


REFUSED_VALUES = {
    "category": (
        {"fields": {"id": {"shape": [], "dtype": "int64", "n": 20}}},
        "id",
        r"holds 20 in row 19, outside its 20 categories 0 \.\. 19",
        _bad_id,
    ),
    "max-value NaN": (
        {"writer": {"kind": "max_value", "key": "next.reward"}},
        "next.reward",
        "holds NaN in row 19; the max_value writer ranks items by it",
        _nan_reward,
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_VALUES))
def test_a_value_an_extend_refuses_stops_the_import_before_any_row(
    tables, tmp_path: Path, case: str
) -> None:
    """A value an extend refuses (outside a field's ``n`` categories; NaN in the max-value
    writer's key) is found by the import's scan, before any row is written: not by the
    extend of the chunk holding it, after the chunks before it went in."""
    extra, column, message, build = REFUSED_VALUES[case]
    folder = tmp_path / "ds"
    folder.mkdir()
    pq.write_table(foreign_table(), folder / "a.parquet")
    pq.write_table(build(), folder / "b.parquet", row_group_size=6)
    table = tables.create(make_spec(**extra))
    for path in (folder / "b.parquet", folder):
        with pytest.raises(SchemaError, match=message) as err:
            table.import_parquet(path, chunk=4)
        assert err.value.field == column and "b.parquet" in str(err.value)
        assert len(table) == 0 and table.rate_limiter.inserts == 0
    assert table.import_parquet(folder / "a.parquet", chunk=4) == 20


def test_an_import_into_a_max_value_table_counts_the_rows_it_kept(tables, tmp_path: Path) -> None:
    # an extend answers each row's slot, -1 for a row the max_value writer dropped: the
    # import counts the rows written, not the rows sent
    path = tmp_path / "falling.parquet"
    rewards = rows(0, 20)["next", "reward"].reshape(-1)
    falling = foreign_table().take(torch.argsort(rewards, descending=True).numpy())
    pq.write_table(falling, path)
    table = tables.create(make_spec(capacity=8, writer={"kind": "max_value", "key": "next.reward"}))
    written = table.import_parquet(path, chunk=4)
    assert written == table.info()["inserts"] == len(table) == 8  # the 12 smaller dropped


BOMB = (
    PEAK
    + """
import sys
from tdreplay.storage import SchemaError, Table, TableSpec
spec = TableSpec.model_validate({"name": "b", "capacity": 8, "backend": {"kind": "memory"},
    "fields": {"obs": {"shape": [2], "dtype": "float32"}}})
table = Table.create(spec, root=sys.argv[2])
before = reset_peak()
try:
    table.import_parquet(sys.argv[1])
except SchemaError as err:
    print(err)
print(peak_growth(before) >> 20, "MiB")
"""
)


def test_a_row_of_a_huge_list_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A file of a few hundred bytes can hold a row of 30M values (a run of zeros compresses
    to nothing); a row is read whole, so reading it to find its length took ~350 MiB (a
    200M-value row: 2.3 GiB, from a 602-byte file). The row group's value count in the file's
    metadata gives it away first; the peak is measured in a process of its own."""
    import subprocess
    import sys

    n = 30_000_000
    huge = pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), pa.array(np.zeros(n, np.float32)))
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"obs": huge}), path, compression="zstd")
    del huge
    assert path.stat().st_size < 4096
    run = [sys.executable, "-c", BOMB, str(path), str(tmp_path / "data")]
    out = subprocess.run(run, capture_output=True, text=True, check=True).stdout.splitlines()
    assert out[0].endswith(
        f"holds {n} values in the 1 rows of row group 0 ({n:g} a row), expected 2 a row (shape [2])"
    )
    assert int(out[1].split()[0]) < 64, out


@pytest.mark.parametrize("chunk", [2.5, True, "8"])
def test_import_refuses_a_chunk_that_is_no_integer(tables, tmp_path: Path, chunk: object) -> None:
    """One rule for an import's ``chunk`` (:func:`tdreplay.codec.protocol.import_chunk`): 2.5
    went on into the reader (a float slice count), ``True`` read as 1 row per extend."""
    table, _ = filled(tables)
    path = table.export(tmp_path / "x.parquet")
    fresh = tables.create(full_spec("y"))
    with pytest.raises(InvalidRequest, match="chunk must be an integer >= 1") as err:
        fresh.import_parquet(path, chunk=chunk)  # type: ignore[arg-type]
    assert err.value.field == "chunk"
    assert len(fresh) == 0
