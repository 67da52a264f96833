"""Parquet columns of Arrow extension types into a table with ``Table.import_parquet``:
Hugging Face ``datasets``' tensor features, and an extension over a struct (the policy and
the reader are ``tdreplay.codec.parquet_import`` / ``parquet_read``, both doors')."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tdreplay.storage import SchemaError, TableSpec


def test_hugging_face_tensor_features_import(tables, tmp_path: Path) -> None:
    """``datasets``' ``Array2D`` .. ``Array5D`` features are Arrow extension types over lists
    of lists; in a process that has imported ``datasets`` (a notebook that just saved the
    file) they were refused as ``unsupported Arrow type extension<...>, not numbers``. Read
    as their storage, under the same policy (a wrong shape is still refused)."""
    datasets = pytest.importorskip("datasets")

    def save(name: str, shape: tuple[int, int], n: int) -> Path:
        feats = datasets.Features(
            {
                "obs": datasets.Array2D(shape=shape, dtype="float32"),
                "next": {"px": datasets.Array3D(shape=(2, 2, 2), dtype="uint8")},
            }
        )
        rows = {
            "obs": [np.arange(6, dtype=np.float32).reshape(shape) + i for i in range(n)],
            "next": [{"px": np.full((2, 2, 2), i, np.uint8)} for i in range(n)],
        }
        datasets.Dataset.from_dict(rows, features=feats).to_parquet(str(tmp_path / name))
        return tmp_path / name

    fields = {
        "obs": {"shape": [2, 3], "dtype": "float32"},
        "next.px": {"shape": [2, 2, 2], "dtype": "uint8"},
    }
    spec = {"name": "hf", "capacity": 8, "backend": {"kind": "memory"}, "fields": fields}
    table = tables.create(TableSpec.model_validate(spec))
    assert table.import_parquet(save("hf.parquet", (2, 3), 5)) == 5
    data = next(iter(table.items().chunks(8)))[0]
    assert data[("obs",)][4].tolist() == [[4.0, 5.0, 6.0], [7.0, 8.0, 9.0]]
    assert data[("next", "px")].dtype == torch.uint8 and data[("next", "px")][
        3
    ].unique().tolist() == [3]
    with pytest.raises(
        SchemaError, match=r"column 'obs' of '.*' row 0 holds a list of 3 values, expected 2"
    ):
        table.import_parquet(save("wrong.parquet", (3, 2), 1))
    assert len(table) == 5


class _Point(pa.ExtensionType):
    """An extension type over a struct (as geoarrow's): two Parquet leaf columns."""

    def __init__(self) -> None:
        super().__init__(pa.struct([("a", pa.int64()), ("b", pa.list_(pa.int64()))]), "test.point")

    def __arrow_ext_serialize__(self) -> bytes:
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type: pa.DataType, serialized: bytes) -> _Point:
        return cls()


def test_an_extension_column_counts_its_stored_leaves(
    tables, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A skipped extension column over a struct was counted as one Parquet leaf: every later
    column read another's metadata (here ``x`` read ``point.b``'s 15 values for 3 rows)."""
    storage = pa.array([{"a": i, "b": [i] * 5} for i in range(3)], _Point().storage_type)
    point = pa.ExtensionArray.from_storage(_Point(), storage)
    pq.write_table(pa.table({"point": point, "x": [1, 2, 3]}), tmp_path / "p.parquet")
    pa.register_extension_type(_Point())  # read back as itself, as its library would
    request.addfinalizer(lambda: pa.unregister_extension_type("test.point"))
    spec = {"name": "p", "capacity": 8, "backend": {"kind": "memory"}}
    table = tables.create(
        TableSpec.model_validate(spec | {"fields": {"x": {"shape": [], "dtype": "int64"}}})
    )
    assert table.import_parquet(tmp_path / "p.parquet", ignore_extra=True) == 3
