"""A Parquet file whose statistics lie: they are the file's own word. A float64 column whose
row-group statistics say its values lie in float32's range while one is 1e39 was spared the
reading that checks the range, and the import rounded 1e39 to inf into the float32 field,
silently, through both doors. Then the values were checked again as they were decoded: the
value was refused at its chunk, but the 4 rows of the chunk before it stayed written. Now no
statistic spares a column the reading before the first row: the file is refused before any
row is written, naming the column, the row and the file, the table left empty (the same
through ``Table.import_parquet`` and a real server's client)."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from testkit import unique

from tdreplay.client import ReplayClient
from tdreplay.storage import SchemaError, TableSpec

FIELDS = {"x": {"shape": [], "dtype": "float32"}}
HIDDEN = 1e39


def lying_file(path: Path) -> Path:
    """10 rows in row groups of 4; row 7 holds 1e39, which the statistics say is 7.0."""
    values = [float(i) for i in range(10)]
    values[7] = HIDDEN
    # gzip and no dictionary: the values' bytes are compressed, only the statistics hold
    # 1e39 as plain bytes
    pq.write_table(
        pa.table({"x": values}), path, row_group_size=4, compression="gzip", use_dictionary=False
    )
    raw = path.read_bytes()
    assert raw.count(struct.pack("<d", HIDDEN))
    path.write_bytes(raw.replace(struct.pack("<d", HIDDEN), struct.pack("<d", 7.0)))
    stats = pq.ParquetFile(path).metadata.row_group(1).column(0).statistics
    assert stats.max == 7.0 and stats.null_count == 0  # the lie the import was told
    return path


def test_a_value_the_statistics_hide_is_refused_before_any_row_through_both_doors(
    client: ReplayClient, tables: Any, tmp_path: Path
) -> None:
    path = lying_file(tmp_path / "lying.parquet")
    name = unique("lying")
    spec = {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    client.create_table(spec)
    table = tables.create(TableSpec.model_validate(spec))
    message = rf"column 'x' of {str(path)!r} holds 1e\+39 in row 7, beyond float32's range"
    with pytest.raises(SchemaError, match=message) as storage:
        table.import_parquet(path, chunk=4)
    with pytest.raises(SchemaError, match=message) as remote:
        client.import_parquet(name, path, chunk=4)
    for err in (storage.value, remote.value):  # no "rows were written" note: none were
        assert not any("written" in note for note in getattr(err, "__notes__", []))
    assert len(table) == 0 and table.live_index().numel() == 0
    assert client.info(name)["size"] == 0 and client.info(name)["stats"]["inserts"] == 0
