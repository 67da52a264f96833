"""Parquet files into tables through a real server: any flat-column file through a column
mapping (``client.import_parquet``, ``tdreplay import --map``), extra columns refused unless
ignored, struct columns (as pandas and Hugging Face ``datasets`` write nested data) into
nested keys, errors that name the column. The same files through ``Table.import_parquet``:
``test_parquet_policy.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasetkit import FIELDS, make_table, one_page
from testkit import run_cli as cli

from tdreplay.client import InvalidRequest, ReplayClient, SchemaError


def foreign_file(path: Path, n: int = 6) -> Path:
    """A Parquet file another tool wrote: its own column names, plain lists, other dtypes."""
    table = pa.table(
        {
            "obs": pa.array([[float(i), 0.0, 1.0] for i in range(n)]),  # list<double>
            "obs_next": pa.array([[float(i + 1), 0.0, 1.0] for i in range(n)]),
            "act": pa.array([[i, -i] for i in range(n)], pa.list_(pa.int32())),
            "rew": pa.array([0.5 * i for i in range(n)]),
            "terminal": pa.array([i == n - 1 for i in range(n)]),
            "timeout": pa.array([False] * n),
            "note": pa.array(["x"] * n),
        }
    )
    pq.write_table(table, path)
    return path


MAPPING = {
    "observation": "obs",
    "action": "act",
    "next.observation": "obs_next",
    "next.reward": "rew",
    "next.done": "terminal",
    "next.terminated": "terminal",
    "next.truncated": "timeout",
    "done": "timeout",
    "traj": "act",  # any column of the right size: a demonstration, not a meaning
}


def test_import_any_parquet_through_a_column_mapping(
    client: ReplayClient, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fields = {k: v for k, v in FIELDS.items() if k != "traj"}
    name = make_table(client, fields=fields)
    src = foreign_file(tmp_path / "d4rl.parquet")
    mapping = {k: v for k, v in MAPPING.items() if k != "traj"}
    with pytest.raises(SchemaError, match=r"column 'note' of '.*' is not a field of the table"):
        client.import_parquet(name, src, columns=mapping)  # no field reads "note"
    assert client.import_parquet(name, src, columns=mapping, ignore_extra=True, chunk=4) == 6
    back = pq.read_table(pa.BufferReader(client.export(name))).to_pydict()
    assert back["observation"][2] == [2.0, 0.0, 1.0] and back["action"][3] == [3, -3]
    assert back["next.reward"] == [[0.5 * i] for i in range(6)]
    assert back["next.done"][-1] == [True]

    def refused(match: str, **kwargs: Any) -> None:
        with pytest.raises(SchemaError, match=match):
            client.import_parquet(name, src, ignore_extra=True, **kwargs)

    refused(r"no column 'observation' for field 'observation'")
    refused(
        r"column 'note' \(for field 'next.reward'\) of '.*' has unsupported Arrow type string",
        columns={**mapping, "next.reward": "note"},
    )
    refused(
        r"column 'obs' \(for field 'next.reward'\) of '.*' holds 18 values in the 6 rows of "
        r"row group 0 \(3 a row\), expected 1 a row \(shape \[1\]\)",
        columns={**mapping, "next.reward": "obs"},
    )
    refused(
        r"column 'rew' \(for field 'action'\) of '.*' has dtype float64, which does not cast "
        "to int64 without loss",
        columns={**mapping, "action": "rew"},
    )
    refused("the mapping nope=obs names no field", columns={**mapping, "nope": "obs"})
    assert client.info(name)["size"] == 6  # nothing written by the refused imports

    args = [f"--map={k}={v}" for k, v in mapping.items()]
    code, out, err = cli(
        "import", name, str(src), *args, "--ignore-extra", "--url", client.urls[0], capsys=capsys
    )
    assert code == 0 and "imported 6 rows" in out, err
    code, _, err = cli("import", name, str(src), *args, "--url", client.urls[0], capsys=capsys)
    assert code == 1 and "column 'note' of" in err and "0 rows were written" in err
    code, _, err = cli("import", name, str(src), "--url", client.urls[0], capsys=capsys)
    assert code == 1 and "no column 'observation'" in err and "0 rows were written" in err
    code, _, err = cli(
        "import", name, str(src), "--map", "obs", "--url", client.urls[0], capsys=capsys
    )
    assert code == 2 and "FIELD=COLUMN" in err


def _nested_rows(n: int) -> dict[str, Any]:
    """The columns of FIELDS with the ``next.*`` fields as one struct column of dicts."""
    return {
        "observation": [[float(i), 1.0, 2.0] for i in range(n)],
        "action": [[i, -i] for i in range(n)],
        "done": [[False]] * n,
        "next": [
            {
                "observation": [float(i + 1), 1.0, 2.0],
                "reward": [0.5 * i],
                "done": [i == n - 1],
                "terminated": [i == n - 1],
                "truncated": [False],
            }
            for i in range(n)
        ],
        "traj": [7] * n,
    }


def test_struct_columns_import_into_nested_keys(client: ReplayClient, tmp_path: Path) -> None:
    """pandas writes a column of dicts as a struct column: its children are the nested
    keys; a tdreplay export (flat dotted columns) reads back the same."""
    import pandas as pd

    n = 5
    path = tmp_path / "pandas.parquet"
    pd.DataFrame(_nested_rows(n)).to_parquet(path)
    assert pa.types.is_struct(pq.read_schema(path).field("next").type)
    name = make_table(client)
    assert client.import_parquet(name, path) == n
    back = client.read(name, list(range(n)))
    assert back["next", "observation"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert back["next", "reward"].flatten().tolist() == [0.5 * i for i in range(n)]
    assert back["next", "done"].flatten().tolist() == [False] * (n - 1) + [True]

    exported = client.export(name, dest=tmp_path / "export.parquet")  # flat "next.reward"...
    copy = make_table(client)
    assert client.import_parquet(copy, exported) == n
    assert (
        pq.read_table(pa.BufferReader(client.export(copy))).to_pydict()
        == pq.read_table(exported).to_pydict()
    )


def test_hugging_face_nested_features_through_the_mapping(
    client: ReplayClient, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: Any
) -> None:
    """Hugging Face ``datasets`` writes nested features as struct columns; ``--map`` names
    a struct's child by its dotted path (next.observation=nxt.obs), in the API and the CLI."""
    import datasets

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    n = 6
    rows = _nested_rows(n)
    nxt = [
        {"obs": r["observation"], "rew": r["reward"][0], "end": r["done"][0]} for r in rows["next"]
    ]
    path = tmp_path / "hf.parquet"
    datasets.Dataset.from_dict(
        {"obs": rows["observation"], "act": rows["action"], "nxt": nxt}
    ).to_parquet(str(path))
    assert pa.types.is_struct(pq.read_schema(path).field("nxt").type)
    mapping = {
        "observation": "obs",
        "action": "act",
        "next.observation": "nxt.obs",
        "next.reward": "nxt.rew",
        "next.done": "nxt.end",
        "next.terminated": "nxt.end",
        "next.truncated": "nxt.end",
        "done": "nxt.end",
    }
    fields = {k: v for k, v in FIELDS.items() if k != "traj"}
    name = make_table(client, fields=fields)
    assert client.import_parquet(name, path, columns=mapping, chunk=4) == n
    back = client.read(name, list(range(n)))
    assert back["next", "observation"][:, 0].tolist() == [float(i + 1) for i in range(n)]
    assert back["next", "reward"].flatten().tolist() == [0.5 * i for i in range(n)]

    with pytest.raises(
        SchemaError,
        match=r"column 'nxt' \(for field 'next.observation'\) of '.*' is a "
        r"struct of nxt.obs, nxt.rew, nxt.end; map the field to one of them",
    ) as e:
        client.import_parquet(name, path, columns={**mapping, "next.observation": "nxt"})
    assert e.value.field == "next.observation"
    with pytest.raises(
        SchemaError,
        match=r"no column 'nxt.nope' for field 'next.reward' in '.*' "
        r"\(columns: obs, act, nxt.obs, nxt.rew, nxt.end\)",
    ):
        client.import_parquet(name, path, columns={**mapping, "next.reward": "nxt.nope"})
    assert client.info(name)["size"] == n  # the refused imports wrote nothing

    args = [f"--map={k}={v}" for k, v in mapping.items()]
    code, out, err = cli("import", name, str(path), *args, "--url", client.urls[0], capsys=capsys)
    assert code == 0 and f"imported {n} rows" in out, err
    assert client.info(name)["size"] == 2 * n


def test_a_column_both_flat_and_a_struct_child_is_refused(
    client: ReplayClient, tmp_path: Path
) -> None:
    n = 3
    rows = _nested_rows(n)
    table = pa.table(rows).append_column("next.reward", pa.array([[1.0]] * n))
    path = tmp_path / "twice.parquet"
    pq.write_table(table, path)
    name = make_table(client)
    with pytest.raises(
        SchemaError,
        match=r"column 'next.reward' of '.*' appears twice: as a column of that name and a "
        r"child of the struct 'next'",
    ) as e:
        client.import_parquet(name, path)
    assert e.value.field == "next.reward" and client.info(name)["size"] == 0


def test_two_columns_of_one_name_are_refused_as_such(client: ReplayClient, tmp_path: Path) -> None:
    """Two flat columns named alike were called "a column of that name and a struct
    column's child", which the file does not hold: the error says what it does."""
    rows = _nested_rows(3)
    table = pa.table(rows)
    table = table.append_column("observation", table.column("observation"))
    path = tmp_path / "dup.parquet"
    pq.write_table(table, path)
    name = make_table(client)
    with pytest.raises(
        SchemaError, match=r"column 'observation' of '.*' appears twice: as 2 columns of that name$"
    ):
        client.import_parquet(name, path)
    assert client.info(name)["size"] == 0


def test_a_page_past_max_batch_bytes_is_refused_through_the_client_and_the_cli(
    client: ReplayClient, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A few KB holding one page of 1M float64 zeros (8 MB decompressed: pyarrow decompresses
    a page whole) is refused from its header where ``max_batch_bytes`` is lower, by both
    the client and ``tdreplay import --max-batch-bytes``, naming the flag; raised, it imports.
    The flag was Minari's alone: the Parquet import took any page whole (the
    memory of the bound: ``tests/storage/test_import_parquet_pages.py``)."""
    path = one_page(tmp_path / "page.parquet", 1_000_000)
    name = make_table(client, fields={"x": {"shape": [], "dtype": "float64"}}, capacity=4096)
    said = "more than max_batch_bytes=4194304 (tdreplay import --max-batch-bytes) allows"
    with pytest.raises(InvalidRequest, match=r"row group 0's largest pages, one per column"):
        client.import_parquet(name, path, max_batch_bytes=4 << 20)
    url = ("--url", client.urls[0])
    code, _, err = cli(
        "import", name, str(path), "--max-batch-bytes", "4194304", *url, capsys=capsys
    )
    assert code == 1 and said in err and "0 rows were written" in err, err
    assert client.info(name)["size"] == 0
    code, out, err = cli("import", name, str(path), *url, capsys=capsys)
    assert code == 0 and "imported 1000000 rows" in out, err
