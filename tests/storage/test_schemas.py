"""Schema files: the shipped ones load and work, the JSON Schema is current, bad ones say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from tdreplay.storage import DTYPES, SchemaError, TableSpec, json_schema

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
SHIPPED = sorted(SCHEMAS.glob("*.yaml"))


def test_schemas_are_shipped() -> None:
    assert {p.stem for p in SHIPPED} >= {"cartpole", "atari", "robot"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_schema_loads_and_extends(path: Path, tables) -> None:
    spec = TableSpec.from_file(path)
    assert spec.name == path.stem
    assert spec.fields
    # The same schema, shrunk to a small in-memory table, takes zero rows and samples them.
    small = TableSpec.model_validate(
        {
            **spec.model_dump(mode="json"),
            "capacity": 32,
            "backend": {"kind": "memory"},
            "rate_limiter": {"min_size_to_sample": 1},
        }
    )
    table = tables.create(small)
    td = TensorDict(
        {
            k: torch.zeros(32, *shape, dtype=dtype)
            for k, (shape, dtype) in small.torch_schema().items()
        },
        batch_size=[32],
    )
    assert table.extend(td).tolist() == list(range(32))
    batch = table.sample(16)
    assert batch.batch_size == torch.Size([16])
    for key, (shape, dtype) in small.torch_schema().items():
        assert batch.get(key).dtype == dtype
        assert list(batch.get(key).shape) == [16, *shape]


def test_from_dir_loads_every_schema_but_the_json_schema() -> None:
    specs = TableSpec.from_dir(SCHEMAS)
    assert sorted(s.name for s in specs) == sorted(p.stem for p in SHIPPED)


def test_cartpole_schema_matches_torchrl_ted_layout() -> None:
    spec = TableSpec.from_file(SCHEMAS / "cartpole.yaml")
    assert spec.torch_schema() == {
        ("observation",): ([4], torch.float32),
        ("action",): ([2], torch.int64),
        ("done",): ([1], torch.bool),
        ("terminated",): ([1], torch.bool),
        ("truncated",): ([1], torch.bool),
        ("next", "observation"): ([4], torch.float32),
        ("next", "reward"): ([1], torch.float32),
        ("next", "done"): ([1], torch.bool),
        ("next", "terminated"): ([1], torch.bool),
        ("next", "truncated"): ([1], torch.bool),
        ("collector", "traj_ids"): ([], torch.int64),
    }


def test_json_schema_file_is_generated_from_the_models() -> None:
    text = (SCHEMAS / "table.schema.json").read_text()
    assert json.loads(text) == json_schema()
    # byte for byte what ``python -m tdreplay.storage.spec`` writes
    assert text == json.dumps(json_schema(), indent=2) + "\n"


def test_json_schema_describes_the_format() -> None:
    schema = json_schema()
    assert set(schema["required"]) == {"name", "capacity", "fields"}
    assert schema["additionalProperties"] is False
    dtype_enum = schema["$defs"]["FieldSpec"]["properties"]["dtype"]["enum"]
    assert dtype_enum == list(DTYPES)


def test_yaml_json_and_dict_forms_agree(tmp_path: Path) -> None:
    spec = TableSpec.from_file(SCHEMAS / "robot.yaml")
    as_json = tmp_path / "robot.json"
    as_json.write_text(json.dumps(spec.model_dump(mode="json")))
    as_yaml = tmp_path / "robot.yaml"
    as_yaml.write_text(spec.to_yaml())
    assert TableSpec.from_file(as_json) == spec
    assert TableSpec.from_file(as_yaml) == spec


def test_defaults() -> None:
    spec = TableSpec.model_validate(
        {"name": "d", "capacity": 3, "fields": {"x": {"dtype": "float32"}}}
    )
    assert spec.backend.kind == "memmap"
    assert spec.sampler.kind == "uniform"
    assert spec.writer.kind == "round_robin"
    assert spec.max_times_sampled == 0
    assert spec.rate_limiter.min_size_to_sample == 1
    assert spec.fields["x"].shape == []
    assert spec.item_nbytes == 4


GOOD_FIELDS = "fields:\n  obs: {shape: [2], dtype: float32}\n  ep: {shape: [], dtype: int64}\n"

# (case id, file text, SchemaError.field, words the message must hold)
MALFORMED = [
    ("bad-yaml", "name: x\ncapacity: [1,\n", None, ["not valid YAML"]),
    ("not-a-mapping", "- a\n- b\n", None, ["must be a mapping", "list"]),
    ("empty-file", "", None, ["must be a mapping"]),
    (
        "unknown-dtype",
        "name: x\ncapacity: 4\nfields:\n  obs: {shape: [2], dtype: complex64}\n",
        "fields.obs.dtype",
        ["fields.obs.dtype", "float32"],
    ),
    (
        "negative-shape",
        "name: x\ncapacity: 4\nfields:\n  obs: {shape: [3, -2], dtype: float32}\n",
        "fields.obs.shape.1",
        ["fields.obs.shape.1", "greater than or equal to 1"],
    ),
    (
        "missing-capacity",
        "name: x\n" + GOOD_FIELDS,
        "capacity",
        ["capacity", "Field required"],
    ),
    (
        "zero-capacity",
        "name: x\ncapacity: 0\n" + GOOD_FIELDS,
        "capacity",
        ["capacity", "greater than or equal to 1"],
    ),
    ("missing-fields", "name: x\ncapacity: 4\n", "fields", ["fields", "Field required"]),
    (
        "bad-name",
        "name: 'a b/c'\ncapacity: 4\n" + GOOD_FIELDS,
        "name",
        ["name", "pattern"],
    ),
    (
        "reserved-field-index",
        "name: x\ncapacity: 4\nfields:\n  index: {shape: [], dtype: int64}\n",
        "fields.index",
        ["'index'", "reserved"],
    ),
    (
        "reserved-field-sample-info",
        "name: x\ncapacity: 4\nfields:\n  sample_info.weight: {shape: [], dtype: float32}\n",
        "fields.sample_info.weight",
        ["'sample_info.weight'", "reserved"],
    ),
    (
        "bad-field-segment",
        "name: x\ncapacity: 4\nfields:\n  next..obs: {shape: [], dtype: int64}\n",
        "fields.next..obs",
        ["'next..obs'", "must match"],
    ),
    (
        "field-segment-with-a-final-newline",  # "$" matches before a final newline: whole names
        'name: x\ncapacity: 4\nfields:\n  "obs\\n": {shape: [], dtype: int64}\n',
        "fields.obs\n",
        ["'obs\\n'", "must match", "(whole)"],
    ),
    (
        "field-names-differing-only-in-case",  # one file on a case-insensitive file system
        "name: x\ncapacity: 4\nfields:\n  obs: {shape: [], dtype: int64}\n"
        "  Obs: {shape: [], dtype: int64}\n",
        "fields.Obs",
        ["'obs' and 'Obs'", "only in case"],
    ),
    (
        "field-nested-under-field",
        "name: x\ncapacity: 4\nfields:\n  next: {shape: [1], dtype: float32}\n"
        "  next.obs: {shape: [1], dtype: float32}\n",
        "fields.next.obs",
        ["'next.obs'", "nested under field 'next'"],
    ),
    (
        "unknown-sampler-kind",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "sampler: {kind: bogus}\n",
        "sampler",
        ["sampler", "'bogus'", "uniform"],
    ),
    (
        "unknown-backend-kind",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "backend: {kind: s3}\n",
        "backend",
        ["backend", "'s3'", "memmap"],
    ),
    (
        "slice-traj-key-missing",
        "name: x\ncapacity: 4\n"
        + GOOD_FIELDS
        + "sampler: {kind: slice, slice_len: 2, traj_key: episode}\n",
        "sampler.traj_key",
        ["sampler.traj_key", "'episode'", "not a field"],
    ),
    (
        "slice-traj-key-not-scalar",
        "name: x\ncapacity: 4\n"
        + GOOD_FIELDS
        + "sampler: {kind: slice, slice_len: 2, traj_key: obs}\n",
        "sampler.traj_key",
        ["sampler.traj_key", "'obs'", "one value per item"],
    ),
    (
        "slice-end-key-missing",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "sampler: {kind: slice, slice_len: 2}\n",
        "sampler.end_key",
        ["sampler.end_key", "'next.done'", "not a field"],
    ),
    (
        "slice-longer-than-capacity",
        "name: x\ncapacity: 4\n"
        + GOOD_FIELDS
        + "sampler: {kind: slice, slice_len: 5, traj_key: ep}\n",
        "sampler.slice_len",
        ["sampler.slice_len", "exceeds capacity"],
    ),
    (
        "slice-len-zero",
        "name: x\ncapacity: 4\n"
        + GOOD_FIELDS
        + "sampler: {kind: slice, slice_len: 0, traj_key: ep}\n",
        "sampler.slice.slice_len",
        ["slice_len", "greater than or equal to 1"],
    ),
    (
        "max-value-key-not-scalar",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "writer: {kind: max_value, key: obs}\n",
        "writer.key",
        ["writer.key", "'obs'", "one value per item"],
    ),
    (
        "max-value-with-fifo",
        "name: x\ncapacity: 4\n"
        + GOOD_FIELDS
        + "writer: {kind: max_value, key: ep}\nsampler: {kind: fifo}\n",
        "writer",
        ["fifo", "round_robin"],
    ),
    (
        "fifo-max-times-sampled",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "sampler: {kind: fifo}\nmax_times_sampled: 3\n",
        "max_times_sampled",
        ["max_times_sampled", "0 or 1"],
    ),
    (
        "samples-per-insert-without-error-buffer",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "rate_limiter: {samples_per_insert: 2.0}\n",
        "rate_limiter",
        ["rate_limiter", "error_buffer"],
    ),
    (
        "error-buffer-below-samples-per-insert",
        "name: x\ncapacity: 4\n"
        + GOOD_FIELDS
        + "rate_limiter: {samples_per_insert: 8.0, error_buffer: 2}\n",
        "rate_limiter",
        ["rate_limiter", "error_buffer 2", "samples_per_insert 8", "wait for good"],
    ),
    (
        "min-size-above-capacity",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "rate_limiter: {min_size_to_sample: 5}\n",
        "rate_limiter.min_size_to_sample",
        ["rate_limiter.min_size_to_sample 5", "exceeds capacity 4", "never be sampled"],
    ),
    (
        "unknown-top-level-key",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "capcity: 9\n",
        "capcity",
        ["capcity", "Extra inputs are not permitted"],
    ),
    (
        "negative-prioritized-alpha",
        "name: x\ncapacity: 4\n" + GOOD_FIELDS + "sampler: {kind: prioritized, alpha: -1}\n",
        "sampler.prioritized.alpha",
        ["alpha", "greater than or equal to 0"],
    ),
]


@pytest.mark.parametrize(
    ("text", "field", "words"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_malformed_schema_names_file_field_and_problem(
    tmp_path: Path, text: str, field: str | None, words: list[str]
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(SchemaError) as info:
        TableSpec.from_file(path)
    message = str(info.value)
    assert message.startswith(f"{path}:"), message
    for word in words:
        assert word in message, (word, message)
    assert info.value.field == field, message


def test_missing_schema_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SchemaError, match=r"nope\.yaml: cannot read schema"):
        TableSpec.from_file(path)


def test_bad_json_schema_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", "capacity": ')
    with pytest.raises(SchemaError, match=r"broken\.json: not valid JSON"):
        TableSpec.from_file(path)


def test_parse_names_its_source() -> None:
    with pytest.raises(SchemaError) as info:
        TableSpec.parse({"name": "x", "capacity": -1, "fields": {}}, source="request body")
    message = str(info.value)
    assert message.startswith("request body: invalid table schema")
    # every problem is listed, not just the first
    assert "capacity" in message and "fields" in message


def test_every_dtype_is_accepted() -> None:
    spec = TableSpec.model_validate(
        {
            "name": "dtypes",
            "capacity": 2,
            "fields": {name: {"shape": [3], "dtype": name} for name in DTYPES},
        }
    )
    assert {n: f.torch_dtype for n, f in spec.fields.items()} == DTYPES
    assert spec.item_nbytes == 3 * sum(d.itemsize for d in DTYPES.values())
    assert set(DTYPES) == {
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "bfloat16",
        "float32",
        "float64",
    }
