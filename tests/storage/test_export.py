"""Export to Parquet / CSV: every backend, every dtype, bit for bit (imports:
``test_import_parquet.py``). Files are read back the ways users read them (pyarrow and the
codec, pandas, tensordict's ``from_parquet`` / ``from_csv``) and compared with the table's rows.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from storage_helpers import assert_bitwise_equal, bits
from tensordict import TensorDict
from testkit import assert_consistent, make_spec, rows

from tdreplay.codec import from_record_batch
from tdreplay.storage import BackendError, InvalidRequest, Table, TableClosed, TableSpec
from tdreplay.storage import export as export_mod
from tdreplay.storage.export import csv_columns
from tdreplay.storage.spec import join_key

# make_spec's fields plus one of every other dtype, scalars and tensors, an image among them
EXTRA = {
    "flag": {"shape": [], "dtype": "bool"},
    "small": {"shape": [], "dtype": "int8"},
    "counts": {"shape": [3], "dtype": "int16"},
    "steps": {"shape": [2], "dtype": "int32"},
    "value": {"shape": [], "dtype": "float64"},
    "q": {"shape": [2], "dtype": "float64"},
    "half": {"shape": [], "dtype": "float16"},
    "brain": {"shape": [], "dtype": "bfloat16"},
    "logits": {"shape": [2, 2], "dtype": "bfloat16"},
    "stats": {"shape": [2], "dtype": "float32"},
    "image": {"shape": [4, 5, 3], "dtype": "uint8"},
}
CAPACITY = 40


def full_spec(name: str = "x", backend: dict | None = None, capacity: int = CAPACITY) -> TableSpec:
    return make_spec(name, capacity=capacity, backend=backend, fields=EXTRA)


def random_items(spec: TableSpec, start: int, n: int) -> TensorDict:
    """Items ``start..start+n-1``: ``id`` counts, every other field is random bits.

    Floats cover subnormals, infinities and -0.0; NaNs are made the canonical
    NaN, the one a text file can say.
    """
    g = torch.Generator().manual_seed(start)
    td = TensorDict(batch_size=[n])
    for key, (shape, dtype) in spec.torch_schema().items():
        size = [n, *shape]
        if key == ("id",):
            t = torch.arange(start, start + n)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, size, generator=g).bool()
        else:
            raw = torch.randint(0, 256, [*size, dtype.itemsize], dtype=torch.uint8, generator=g)
            t = raw.view(dtype).squeeze(-1)
            if dtype.is_floating_point:
                t = torch.where(t.isnan(), torch.tensor(float("nan"), dtype=dtype), t)
        td.set(key, t)
    return td


def filled(tables, backend: dict | None = None, name: str = "x") -> tuple[Table, TensorDict]:
    """A table that wrapped around once (oldest-first order differs from slot order), and its rows."""
    spec = full_spec(name, backend)
    table = tables.create(spec)
    table.extend(random_items(spec, 0, 30))
    table.extend(random_items(spec, 30, 25))
    expected = table.read(table.live_index())
    assert expected["id"].tolist() == list(range(15, 55))
    return table, expected


def numpy_of(t: torch.Tensor) -> np.ndarray:
    """What a reader should see for ``t``: bfloat16 as its uint16 bits."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def canonical_nans(t: torch.Tensor) -> torch.Tensor:
    """``t`` with every NaN the canonical one: a text round trip keeps NaN, not its payload
    (and torch's own float64 -> bfloat16 cast turns NaN into 0xFFFF)."""
    if not t.dtype.is_floating_point:
        return t
    return torch.where(t.isnan(), torch.tensor(float("nan"), dtype=t.dtype), t)


def same_array(got: np.ndarray, want: np.ndarray) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()


def fields(spec: TableSpec) -> list[tuple[tuple[str, ...], str, list[int], torch.dtype]]:
    return [(k, join_key(k), s, d) for k, (s, d) in spec.torch_schema().items()]


# ------------------------------------------------------------------ Parquet
def test_parquet_reads_back_with_pyarrow_pandas_and_tensordict(
    backend: dict, tables, tmp_path: Path
) -> None:
    table, expected = filled(tables, backend)
    path = table.export(tmp_path / "out" / "x.parquet")
    assert path == (tmp_path / "out" / "x.parquet").absolute()
    assert sorted(p.name for p in path.parent.iterdir()) == ["x.parquet"]  # no temp file left
    spec = table.spec
    n = len(expected)

    # the wire schema: fixed-size lists with shape/dtype metadata, bfloat16 as uint16 bits
    schema = pq.read_schema(path)
    assert schema.names == [name for _, name, _, _ in fields(spec)]
    assert schema.metadata[b"tdreplay.table"] == b"x"
    saved = json.loads(schema.metadata[b"tdreplay.spec"])
    assert "backend" not in saved  # where a server kept the data is not the file's business
    assert TableSpec.model_validate(saved).fields == spec.fields
    obs = schema.field("observation")
    assert obs.type == pa.list_(pa.float32(), 3) and not obs.nullable
    assert obs.metadata == {b"tdreplay.dtype": b"float32", b"tdreplay.shape": b"[3]"}
    assert schema.field("logits").type == pa.list_(pa.uint16(), 4)
    assert schema.field("logits").metadata[b"tdreplay.dtype"] == b"bfloat16"
    assert schema.field("image").metadata[b"tdreplay.shape"] == b"[4, 5, 3]"
    assert schema.field("brain").type == pa.uint16()
    assert schema.field("next.reward").type == pa.list_(pa.float16(), 1)

    # pyarrow + the codec: every dtype and shape back, bit for bit
    assert_bitwise_equal(expected, from_record_batch(pq.read_table(path)))

    # pandas: scalars as columns of their dtype, tensors as arrays of their elements
    df = pd.read_parquet(path)
    assert len(df) == n
    for key, name, shape, _ in fields(spec):
        want = numpy_of(expected[key])
        col = df[name].to_numpy()
        got = col if not shape else np.stack(list(col)).reshape(want.shape)
        assert same_array(got, want), name

    # tensordict: scalar columns keep their dtype; list columns come through Python lists,
    # so tensors arrive flat with torch's default dtypes (see the export module docstring)
    td = TensorDict.from_parquet(path, separator=".")
    assert td.batch_size == torch.Size([n])
    for key, name, shape, dtype in fields(spec):
        want, got = expected[key], td[key]
        if not shape:
            if dtype == torch.bfloat16:
                assert got.dtype == torch.uint16
                got = got.view(torch.bfloat16)
            assert_bitwise_equal(TensorDict({"v": want}, [n]), TensorDict({"v": got}, [n]))
            continue
        assert got.shape == (n, want[0].numel()), name
        flat = want.reshape(n, -1)
        if dtype == torch.bfloat16:
            assert got.dtype == torch.int64
            assert torch.equal(got, flat.view(torch.int16).to(torch.int64) & 0xFFFF), name
        elif dtype == torch.float64:  # rounded to float32 by tensordict
            assert got.dtype == torch.float32
            assert torch.equal(bits(got), bits(flat.float())), name
        elif dtype.is_floating_point:
            assert got.dtype == torch.float32
            assert torch.equal(bits(canonical_nans(got.to(dtype))), bits(flat)), name
        else:
            assert got.dtype == (torch.bool if dtype == torch.bool else torch.int64), name
            assert torch.equal(got.to(dtype), flat), name


def test_parquet_chunks_become_row_groups_in_order(
    tables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(export_mod, "MIN_CHUNK_ROWS", 8)
    monkeypatch.setattr(export_mod, "MAX_CHUNK_ROWS", 8)
    table, _ = filled(tables)
    path = table.export(tmp_path / "x.parquet")
    meta = pq.ParquetFile(path).metadata
    assert [meta.row_group(i).num_rows for i in range(meta.num_row_groups)] == [8] * 5
    assert pq.read_table(path, columns=["id"])["id"].to_pylist() == list(range(15, 55))


def test_empty_table_exports_schema_only(tables, tmp_path: Path) -> None:
    table = tables.create(full_spec())
    p = table.export(tmp_path / "e.parquet")
    assert pq.read_table(p).num_rows == 0
    assert pq.read_schema(p).field("image").type == pa.list_(pa.uint8(), 60)
    c = table.export(tmp_path / "e.csv")
    header = c.read_text().splitlines()
    assert len(header) == 1 and header[0].startswith('"id","observation[0]"')
    assert tables.create(full_spec("y")).import_parquet(p) == 0


# ------------------------------------------------------------------ CSV
def test_csv_column_names() -> None:
    assert csv_columns("id", []) == ["id"]
    assert csv_columns("next.reward", [1]) == ["next.reward[0]"]
    assert csv_columns("pixels", [2, 2]) == [
        "pixels[0,0]",
        "pixels[0,1]",
        "pixels[1,0]",
        "pixels[1,1]",
    ]
    assert len(csv_columns("image", [4, 5, 3])) == 60 and csv_columns("e", [0]) == []


def test_csv_reads_back_with_pandas_and_tensordict(backend: dict, tables, tmp_path: Path) -> None:
    table, expected = filled(tables, backend)
    path = table.export(tmp_path / "x.csv")
    spec = table.spec
    n = len(expected)
    names = [c for _, name, shape, _ in fields(spec) for c in csv_columns(name, shape)]

    df = pd.read_csv(path)
    assert list(df.columns) == names and len(df) == n
    td = TensorDict.from_csv(path, separator=".")
    assert td.batch_size == torch.Size([n])
    for key, name, shape, dtype in fields(spec):
        cols = csv_columns(name, shape)
        want = expected[key]
        kind = torch.float64 if dtype.is_floating_point else torch.int64
        if dtype == torch.bool:
            kind = torch.bool
        from_pandas = torch.from_numpy(df[cols].to_numpy(copy=True))
        from_td = torch.stack([td[tuple(c.split("."))] for c in cols], 1)
        for got in (from_pandas, from_td):
            assert got.dtype == kind, (name, got.dtype)
            got = canonical_nans(got.to(dtype).reshape(want.shape))
            assert torch.equal(bits(got), bits(want)), name


def test_csv_floats_stay_floats_and_exact(tables, tmp_path: Path) -> None:
    table = tables.create(make_spec())
    data = rows(0, 4)  # integral floats: 0.0, 1.0, ...
    data["observation"][0] = torch.tensor([-0.0, 0.1, 1e-45])
    table.extend(data)
    path = table.export(tmp_path / "x.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == (
        '"id","observation[0]","observation[1]","observation[2]","action[0]","action[1]",'
        '"next.reward[0]","next.done[0]","pixels[0,0]","pixels[0,1]","pixels[1,0]","pixels[1,1]"'
    )
    # float32 0.1 and the smallest subnormal as the float64 values they are
    assert lines[1] == "0,-0.0,0.10000000149011612,1.401298464324817e-45,0.0,0.0,0.0,false,0,0,0,0"
    assert lines[2] == "1,1.0,1.0,1.0,1.0,1.0,1.0,false,1,1,1,1"
    df = pd.read_csv(path)
    assert df["observation[0]"].dtype == np.float64 and df["next.done[0]"].dtype == np.bool_
    got = torch.from_numpy(df[csv_columns("observation", [3])].to_numpy()).float()
    assert torch.equal(bits(got), bits(data["observation"]))


def test_format_from_suffix_or_argument(tables, tmp_path: Path) -> None:
    table, _ = filled(tables)
    assert table.export(tmp_path / "a.txt", format="CSV").read_text().startswith('"id"')
    assert pq.read_table(table.export(tmp_path / "b.data", format="parquet")).num_rows == 40
    with pytest.raises(InvalidRequest, match="cannot tell the export format") as err:
        table.export(tmp_path / "c.json")
    assert err.value.field == "path"
    with pytest.raises(InvalidRequest, match="unknown export format 'xlsx'"):
        table.export(tmp_path / "c.csv", format="xlsx")
    with pytest.raises(InvalidRequest, match="is a folder"):
        table.export(tmp_path, format="csv")
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "c.csv").exists()


# ------------------------------------------------------------------ atomicity, snapshots
@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_failed_export_leaves_no_file(
    tables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, suffix: str
) -> None:
    monkeypatch.setattr(export_mod, "MIN_CHUNK_ROWS", 8)
    monkeypatch.setattr(export_mod, "MAX_CHUNK_ROWS", 8)
    table, _ = filled(tables)
    out = tmp_path / "out"
    out.mkdir()
    read = table.backend.read
    calls = []

    def failing_read(index: torch.Tensor):
        calls.append(len(index))
        if len(calls) == 3:
            raise BackendError("disk on fire")
        return read(index)

    monkeypatch.setattr(table.backend, "read", failing_read)
    with pytest.raises(BackendError, match="disk on fire"):
        table.export(out / f"x{suffix}")
    assert list(out.iterdir()) == []
    # an existing file is left as it was
    (out / f"x{suffix}").write_text("previous")
    calls.clear()
    with pytest.raises(BackendError):
        table.export(out / f"x{suffix}")
    assert [p.name for p in out.iterdir()] == [f"x{suffix}"]
    assert (out / f"x{suffix}").read_text() == "previous"


def test_closed_table_does_not_export(tables, tmp_path: Path) -> None:
    table, _ = filled(tables)
    table.close()
    with pytest.raises(TableClosed, match="is closed"):
        table.export(tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []


def test_unwritable_destination_is_a_backend_error(tables, tmp_path: Path) -> None:
    table, _ = filled(tables)
    (tmp_path / "file").write_text("")
    with pytest.raises(BackendError, match="export to"):
        table.export(tmp_path / "file" / "x.parquet")


def test_items_overwritten_during_an_export_are_left_out(
    tables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    table, expected = filled(tables)
    items = table.items

    def items_then_insert():
        taken = items()
        table.extend(random_items(table.spec, 55, 5))  # overwrites items 15..19 after them
        return taken

    monkeypatch.setattr(table, "items", items_then_insert)
    with caplog.at_level(logging.WARNING, logger="tdreplay.storage.export"):
        path = table.export(tmp_path / "x.parquet")
    assert "5 of 40 items were overwritten or removed" in caplog.text
    assert (path.rows, path.skipped) == (35, 5)  # the caller is told, not only the log
    got = from_record_batch(pq.read_table(path))
    assert_bitwise_equal(expected[5:], got)  # items 20..54: whole, oldest first


def test_export_while_writers_and_samplers_run(
    tables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No deadlock with samplers (they take the table lock, then the data lock), no torn rows."""
    monkeypatch.setattr(export_mod, "MIN_CHUNK_ROWS", 16)
    monkeypatch.setattr(export_mod, "MAX_CHUNK_ROWS", 16)
    table = tables.create(make_spec(capacity=256, backend={"kind": "memmap"}))
    table.extend(rows(0, 256))
    stop = threading.Event()
    errors: list[BaseException] = []

    def run(fn) -> None:
        try:
            while not stop.is_set():
                fn()
        except BaseException as err:
            errors.append(err)

    counter = iter(range(256, 10**9, 8))

    def insert() -> None:
        table.extend(rows(next(counter), 8))
        time.sleep(0.001)  # a ring this small would otherwise turn over within one export

    workers = [
        threading.Thread(target=run, args=(insert,)),
        threading.Thread(target=run, args=(lambda: assert_consistent(table.sample(32)),)),
    ]
    for w in workers:
        w.start()
    try:
        exported = []
        for i in range(5):
            got = from_record_batch(pq.read_table(table.export(tmp_path / f"{i}.parquet")))
            ids = got["id"]
            assert len(ids) <= 256 and bool((ids[1:] > ids[:-1]).all())  # oldest first
            assert_consistent(got)
            assert torch.equal(got["next", "done"], (ids % 10 == 9)[:, None])
            exported.append(len(ids))
        assert max(exported) > 0
    finally:
        stop.set()
        for w in workers:
            w.join(10)
    assert not errors, errors[0]


def test_progress_bar(tables, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    table, _ = filled(tables)
    table.export(tmp_path / "a.parquet")  # auto: small table, not a terminal
    assert capsys.readouterr().err == ""
    table.export(tmp_path / "b.parquet", progress=True)
    assert "export x" in capsys.readouterr().err
    tables.create(full_spec("y")).import_parquet(tmp_path / "b.parquet", progress=True)
    assert "import y" in capsys.readouterr().err


def test_demo_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tdreplay.storage import demo

    assert demo.main(["--root", str(tmp_path), "--steps", "2000"]) == 0
    out = capsys.readouterr().out
    assert "data identical: True, priorities identical: True, next draws identical: True" in out
    assert pq.read_metadata(tmp_path / "demo" / "cartpole.parquet").num_rows == 2000


def test_an_insert_in_flight_is_not_in_the_items(tmp_path: Path) -> None:
    """An insert takes its ordinals before it writes its rows: items taken while one was
    writing counted 50 items, then read 60 once it was done (a live export reported 100
    rows written and -10 left out)."""
    spec = make_spec("x", capacity=100, backend={"kind": "memory"})
    table = Table.create(spec, tmp_path)
    try:
        table.extend(rows(0, 100))  # full: the next insert overwrites slots 0..9
        writing, go_on = threading.Event(), threading.Event()

        def hold(target: object) -> None:  # the insert's rows are about to be written
            writing.set()
            assert go_on.wait(10)

        table._before_write.append(hold)
        insert = threading.Thread(target=table.extend, args=(rows(100, 10),))
        insert.start()
        assert writing.wait(10)
        table._before_write.remove(hold)
        items = table.items()
        go_on.set()
        insert.join(10)
        assert len(table) == 100
        read = sum(int(next(iter(d.values())).shape[0]) for d, _ in items.chunks(16))
        assert len(items) == read == 90
    finally:
        table.destroy()
