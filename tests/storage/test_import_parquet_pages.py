"""A Parquet import's memory follows its chunk, not the file's pages or row groups.

pyarrow decompresses a page whole, and by default read a row group's column chunk whole
before decoding it. A 10 KB file held one zstd page of 40M float64 zeros (320 MB
decompressed): ``Table.import_parquet`` grew by 383 MB and imported it; an honest 160 MB file
of one row group grew it by 156 MB (now 14 MB). Now a row group whose largest pages decompress past
``max_batch_bytes`` is refused from the page headers, and a file is read a buffer at a time.
Each import runs in a process of its own, whose peak resident memory is measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasetkit import one_page
from testkit import PEAK

from tdreplay.codec.protocol import MAX_BATCH_BYTES
from tdreplay.storage import TableSpec

#: the tables' one field
X = {"x": {"shape": [], "dtype": "float64"}}
#: a fresh process importing argv[1] into a float64 scalar table at argv[2] (argv[3]: the
#: max_batch_bytes, or "default"); prints what it wrote or its error, and the peak's growth
MEASURE = (
    PEAK
    + """
import json, sys
import pyarrow as pa, pyarrow.parquet as pq, numpy as np
from tdreplay.storage import TDReplayError, Table, TableSpec
spec = TableSpec.model_validate({"name": "b", "capacity": 4096, "backend": {"kind": "memory"},
    "fields": {"x": {"shape": [], "dtype": "float64"}}})
table = Table.create(spec, root=sys.argv[2])
warm = sys.argv[2] + "-warm.parquet"  # the import's code paths once, before measuring
pq.write_table(pa.table({"x": np.zeros(100)}), warm)
table.import_parquet(warm)
before = reset_peak()  # not torch's import's peak, nor the test process's
try:
    bound = {} if sys.argv[3] == "default" else {"max_batch_bytes": int(sys.argv[3])}
    got = {"written": table.import_parquet(sys.argv[1], **bound)}
except TDReplayError as err:
    got = {"error": f"{type(err).__name__}: {err}"}
got["grown_mb"] = peak_growth(before) / (1 << 20)
got["inserts"] = table.info()["inserts"] - 100
print(json.dumps(got))
"""
)


def imported(path: Path, tmp_path: Path, max_batch_bytes: int | None = None) -> dict:
    bound = "default" if max_batch_bytes is None else str(max_batch_bytes)
    run = [sys.executable, "-c", MEASURE, str(path), str(tmp_path / "data"), bound]
    done = subprocess.run(run, capture_output=True, text=True, check=True, timeout=300)
    return json.loads(done.stdout.splitlines()[-1])


def test_a_page_past_max_batch_bytes_is_refused_before_it_is_decompressed(tmp_path: Path) -> None:
    rows = 5_000_000  # 40 MB decompressed
    path = one_page(tmp_path / "bomb.parquet", rows)
    assert path.stat().st_size < 64 * 1024
    got = imported(path, tmp_path)
    assert MAX_BATCH_BYTES == 32 << 20
    assert got.get("error", "").startswith(
        f"InvalidRequest: table 'b': {path}: row group 0's largest pages, one per column, "
        f"decompress to {rows * 8 + 9} bytes (column 'x': {rows * 8 + 9}), more than "
        "max_batch_bytes=33554432 (tdreplay import --max-batch-bytes) allows"
    ), got
    assert got["grown_mb"] < 16 and got["inserts"] == 0, got


def test_max_batch_bytes_is_the_bound_on_pages(tmp_path: Path) -> None:
    rows = 1_000_000  # 8 MB decompressed
    path = one_page(tmp_path / "page.parquet", rows)
    got = imported(path, tmp_path, max_batch_bytes=4 << 20)
    assert "more than max_batch_bytes=4194304 (tdreplay import" in got.get("error", ""), got
    got = imported(path, tmp_path)
    assert got["written"] == got["inserts"] == rows, got


def test_a_large_row_group_is_read_a_buffer_at_a_time(tmp_path: Path) -> None:
    """An honest file of one 48 MB row group (random floats: no compression helps): read a
    column chunk whole, the import grew by more than the file."""
    rows = 6_000_000
    path = tmp_path / "large.parquet"
    values = np.random.default_rng(0).standard_normal(rows)
    pq.write_table(pa.table({"x": values}), path, compression="none", row_group_size=rows)
    del values
    assert pq.ParquetFile(path).metadata.num_row_groups == 1
    got = imported(path, tmp_path)
    assert got["written"] == got["inserts"] == rows, got
    assert got["grown_mb"] < 24, got


def test_a_file_of_many_row_groups_imports(tables, tmp_path: Path) -> None:
    """70,000 row groups (one per write, as a streaming writer makes them): the footer of a
    plain file is read with pyarrow's own bounds, not the tighter ones of a Minari episode's
    file (at most 65,536 row groups: 'Couldn't deserialize thrift')."""
    path = tmp_path / "many.parquet"
    pq.write_table(pa.table({"x": np.arange(70_000, dtype=np.float64)}), path, row_group_size=1)
    spec = {"name": "many", "capacity": 4096, "backend": {"kind": "memory"}, "fields": X}
    table = tables.create(TableSpec.model_validate(spec))
    assert table.import_parquet(path) == 70_000
    assert table.info()["inserts"] == 70_000
