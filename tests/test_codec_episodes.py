"""Rows <-> episodes (tdreplay.codec.episodes) and Minari datasets from real Parquet exports
(tdreplay.codec.minari_files), read back with minari itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import minari
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from datasetkit import FIELDS, contains_every_step, transitions
from tensordict import TensorDict

from tdreplay.codec.episodes import EpisodeLayout, EpisodeSplitter
from tdreplay.codec.errors import InvalidRequest, PathExists, SchemaError
from tdreplay.codec.minari_files import read_minari, write_minari
from tdreplay.storage import Table, TableSpec


def table(tmp_path: Path, name: str, *, fields: dict | None = None, **extra: Any) -> Table:
    spec = TableSpec.model_validate(
        {
            "name": name,
            "capacity": 1000,
            "backend": {"kind": "memory"},
            "fields": fields or FIELDS,
            **extra,
        }
    )
    return Table.create(spec, root=tmp_path / "data")


def flat(td: TensorDict) -> dict[str, np.ndarray]:
    leaves = td.items(include_nested=True, leaves_only=True)
    return {k if isinstance(k, str) else ".".join(k): v.numpy() for k, v in leaves}


def test_layout_names_what_is_missing() -> None:
    fields = {k: v for k, v in FIELDS.items() if k != "next.observation"}
    with pytest.raises(SchemaError, match=r"missing keys for episodes: next\.observation") as e:
        EpisodeLayout.of({"fields": fields})
    assert e.value.field == "next.observation"
    no_flags = {k: v for k, v in FIELDS.items() if not k.startswith(("next.d", "next.t"))}
    no_flags.pop("traj")
    with pytest.raises(SchemaError, match="no episode boundary"):
        EpisodeLayout.of({"fields": no_flags})
    with pytest.raises(SchemaError, match="'nope' is not a field"):
        EpisodeLayout.of({"fields": FIELDS}, "nope")


def test_done_flags_cut_episodes_across_chunks() -> None:
    rows = flat(transitions([3, 5, 2, 4]))
    splitter = EpisodeSplitter(EpisodeLayout.of({"fields": FIELDS}))
    episodes = []
    for lo in range(0, 14, 4):  # chunks that cut episodes in the middle
        episodes += splitter.feed({k: v[lo : lo + 4] for k, v in rows.items()})
    episodes += splitter.finish()
    assert [len(e.rewards) for e in episodes] == [3, 5, 2, 4]
    second = episodes[1]
    assert second.observations.shape == (6, 3)  # T + 1
    assert second.observations[:, 1].tolist() == [0, 1, 2, 3, 4, 5]
    assert second.rewards.tolist() == [10, 11, 12, 13, 14]
    assert second.terminations.tolist() == [False] * 4 + [True]
    assert not second.truncations.any()
    assert second.infos["traj"].tolist() == [1] * 6  # one per observation, as Minari's


def test_no_boundary_found_in_the_rows() -> None:
    rows = flat(transitions([4]))
    for key in ("next.done", "next.terminated"):
        rows[key][:] = False
    splitter = EpisodeSplitter(EpisodeLayout.of({"fields": FIELDS}))
    assert splitter.feed(rows) == []
    with pytest.raises(SchemaError, match="no episode boundary found in 4 rows"):
        splitter.finish()


def test_trajectory_key_joins_interleaved_rows() -> None:
    a, b = flat(transitions([4], traj0=7)), flat(transitions([3], traj0=9))
    for key in ("next.done", "next.terminated"):  # only the trajectory ids tell them apart
        a[key][:], b[key][:] = False, False
    order = [("a", 0), ("a", 1), ("b", 0), ("a", 2), ("b", 1), ("b", 2), ("a", 3)]
    src = {"a": a, "b": b}
    rows = {k: np.stack([src[s][k][i] for s, i in order]) for k in a}
    splitter = EpisodeSplitter(EpisodeLayout.of({"fields": FIELDS}, "traj"))
    assert splitter.feed(rows) == []
    first, second = splitter.finish()
    assert first.infos["traj"].tolist() == [7] * 5 and second.infos["traj"].tolist() == [9] * 4
    assert first.observations[:, 1].tolist() == [0, 1, 2, 3, 4]


def test_minari_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = table(tmp_path, "src")
    source.extend(transitions([3, 5, 2, 4], truncate_last=True))
    parquet = source.export(tmp_path / "src.parquet")
    root = tmp_path / "datasets"
    out = write_minari(parquet, root, "tdreplay/src-v0", env_spec="CartPole-v1")
    assert out == root / "tdreplay" / "src-v0"
    assert [p.name for p in out.parent.iterdir()] == ["src-v0"]  # nothing left aside
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    ds = minari.load_dataset("tdreplay/src-v0")
    assert (ds.total_episodes, ds.total_steps) == (4, 14)
    assert ds.env_spec.id == "CartPole-v1"
    meta = ds.storage.metadata
    assert meta["tdreplay_table"] == "src" and meta["tdreplay_version"]
    assert '"next.reward"' in meta["tdreplay_schema"]
    last = ds[3]
    assert last.observations.shape == (5, 3) and last.actions.shape == (4, 2)
    assert last.truncations.tolist() == [False] * 3 + [True]
    assert not last.terminations.any()

    copy = table(tmp_path, "copy")
    fields = {k: f.model_dump() for k, f in copy.spec.fields.items()}
    total, chunks = read_minari(root, "tdreplay/src-v0", fields, chunk=5)
    assert total == 14
    for rows in chunks:
        leaves = {tuple(k.split(".")): torch.from_numpy(v) for k, v in rows.items()}
        copy.extend(TensorDict(leaves, [len(rows["traj"])]))
    again = copy.export(tmp_path / "copy.parquet")
    assert pq.read_table(again).to_pydict() == pq.read_table(parquet).to_pydict()  # every field

    with pytest.raises(PathExists):
        write_minari(parquet, root, "tdreplay/src-v0")
    with pytest.raises(InvalidRequest, match="namespace/name-v0"):
        write_minari(parquet, root, "../escape")
    with pytest.raises(InvalidRequest, match=r"no Minari dataset 'tdreplay/nope-v0'.*src-v0"):
        read_minari(root, "tdreplay/nope-v0", fields)
    assert os.listdir(root / "tdreplay") == ["src-v0"]


def test_torchrl_collector_ids_are_the_trajectory_key_by_default() -> None:
    cartpole = TableSpec.from_file(
        Path(__file__).parents[1] / "schemas" / "cartpole.yaml"
    ).model_dump(mode="json")
    assert EpisodeLayout.of(cartpole).trajectory == "collector.traj_ids"
    slices = {**cartpole, "sampler": {"kind": "slice", "slice_len": 2, "traj_key": "done"}}
    assert EpisodeLayout.of(slices).trajectory == "done"  # the sampler's names it first
    assert EpisodeLayout.of({"fields": FIELDS}).trajectory is None  # "traj" is just a field
    assert EpisodeLayout.of({"fields": FIELDS}, "traj").trajectory == "traj"


@pytest.mark.parametrize("data_format", ["hdf5", "arrow", "parquet"])
def test_spaces_come_from_the_schema_and_contain_the_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_format: str
) -> None:
    """No env spec: the spaces are the table's, field by field, and minari reads back a
    dataset whose every step lies in them (both of Minari's storage formats)."""
    from gymnasium import spaces

    leaves = {
        "state": {"shape": [3], "dtype": "float32"},
        "pixels": {"shape": [2, 2], "dtype": "uint8"},
        "flag": {"shape": [], "dtype": "bool"},
        "mask": {"shape": [2], "dtype": "bool"},
        "half": {"shape": [2], "dtype": "bfloat16"},
        "cell": {"shape": [], "dtype": "int16", "n": 5},
    }
    fields = {
        **{f"observation.{k}": v for k, v in leaves.items()},
        **{f"next.observation.{k}": v for k, v in leaves.items()},
        "action": {"shape": [], "dtype": "int64", "n": 3},
        "next.reward": {"shape": [1], "dtype": "float32"},
        "next.done": {"shape": [1], "dtype": "bool"},
    }
    n = 7
    steps = torch.arange(n)
    data = {
        "state": steps[:, None].float().expand(n, 3),
        "pixels": (steps[:, None, None] * 30).to(torch.uint8).expand(n, 2, 2),
        "flag": steps % 2 == 0,
        "mask": torch.stack([steps % 2 == 0, steps % 3 == 0], 1),
        "half": steps[:, None].to(torch.bfloat16).expand(n, 2),
        "cell": (steps % 5).to(torch.int16),
    }
    rows = TensorDict(
        {
            "observation": data,
            "next": {
                "observation": {k: v.roll(-1, 0) for k, v in data.items()},
                "reward": torch.ones(n, 1),
                "done": (steps == 2) | (steps == n - 1),
            },
            "action": steps % 3,
        },
        [n],
    )
    rows["next", "done"] = rows["next", "done"][:, None]
    source = table(tmp_path, "sp", fields=fields)
    source.extend(rows)
    parquet = source.export(tmp_path / "sp.parquet")
    root = tmp_path / "datasets"
    write_minari(parquet, root, "tdreplay/sp-v0", data_format=data_format)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    ds = minari.load_dataset("tdreplay/sp-v0")
    assert ds.env_spec is None
    assert ds.action_space == spaces.Discrete(3)
    obs = ds.observation_space
    assert isinstance(obs, spaces.Dict) and set(obs.spaces) == set(leaves)
    assert obs["state"] == spaces.Box(-np.inf, np.inf, (3,), np.float32)
    assert obs["pixels"] == spaces.Box(0, 255, (2, 2), np.uint8)
    assert obs["flag"] == spaces.Box(0, 1, (), bool)
    assert obs["mask"] == spaces.Box(0, 1, (2,), bool)
    assert obs["half"] == spaces.Box(-np.inf, np.inf, (2,), np.float32)  # written as float32
    assert obs["cell"] == spaces.Discrete(5)
    assert contains_every_step(ds) == n
    assert [len(e.rewards) for e in ds.iterate_episodes()] == [3, 4]

    copy = table(tmp_path, "sp2", fields=fields)  # and back, every field as it was
    spec = copy.spec.fields
    _, chunks = read_minari(root, "tdreplay/sp-v0", {k: f.model_dump() for k, f in spec.items()})
    for got in chunks:
        leaves_ = {
            tuple(k.split(".")): torch.from_numpy(v).to(spec[k].torch_dtype) for k, v in got.items()
        }
        copy.extend(TensorDict(leaves_, [len(got["action"])]))
    again = copy.export(tmp_path / "sp2.parquet")
    assert pq.read_table(again).to_pydict() == pq.read_table(parquet).to_pydict()


def test_integer_actions_without_categories_and_multi_discrete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An integer field without ``n`` is a Box over its dtype's range; a tensor field with
    ``n`` a MultiDiscrete; a value outside the declared categories never gets into the
    table, and one in a file (from elsewhere: a table that declared no ``n``) stops the
    dataset's writing, which leaves nothing behind."""
    from gymnasium import spaces

    root = tmp_path / "datasets"
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    source = table(tmp_path, "ints")
    source.extend(transitions([3, 2]))  # FIELDS' action: int64 [2], no n
    write_minari(source.export(tmp_path / "ints.parquet"), root, "tdreplay/ints-v0")
    ds = minari.load_dataset("tdreplay/ints-v0")
    info = np.iinfo(np.int64)
    assert ds.action_space == spaces.Box(info.min, info.max, (2,), np.int64)
    assert contains_every_step(ds) == 5

    fields = {**FIELDS, "action": {"shape": [2], "dtype": "int32", "n": 10}}
    multi = table(tmp_path, "multi", fields=fields)
    rows = transitions([3, 2])
    rows["action"] = rows["action"].to(torch.int32)  # 0 .. 9
    multi.extend(rows)
    write_minari(multi.export(tmp_path / "multi.parquet"), root, "tdreplay/multi-v0")
    ds = minari.load_dataset("tdreplay/multi-v0")
    assert ds.action_space == spaces.MultiDiscrete([10, 10], dtype=np.int32)
    assert contains_every_step(ds) == 5

    bad = rows.clone()
    bad["action"][4, 1] = 10  # row 4 leaves the categories
    with pytest.raises(InvalidRequest, match="'action' holds 10, outside its 10 categories"):
        multi.extend(bad)
    loose = table(tmp_path, "loose", fields={**fields, "action": {"shape": [2], "dtype": "int32"}})
    loose.extend(rows)
    loose.extend(bad)  # row 9 of the file
    file = pq.read_table(loose.export(tmp_path / "loose.parquet"))
    spec = json.loads(file.schema.metadata[b"tdreplay.spec"])
    spec["fields"]["action"]["n"] = 10  # the rows, with the spec of a table declaring n
    declared = tmp_path / "bad.parquet"
    meta = {**file.schema.metadata, b"tdreplay.spec": json.dumps(spec).encode()}
    pq.write_table(file.replace_schema_metadata(meta), declared)
    with pytest.raises(SchemaError, match=r"'action' holds 10 in row 9, outside its n = 10") as err:
        write_minari(declared, root, "tdreplay/bad-v0")
    assert err.value.field == "action"
    assert sorted(os.listdir(root / "tdreplay")) == ["ints-v0", "multi-v0"]


def test_a_failed_export_leaves_no_folder_and_an_empty_table_none_at_all(tmp_path: Path) -> None:
    """An export that fails left the datasets root and the id's namespace folders it had
    made (``ds/ns/deep`` for ``ns/deep/name-v0``); an empty table made a dataset whose
    HDF5 file was 0 bytes, which Minari itself cannot iterate (``file signature not found``)."""
    root = tmp_path / "ds"
    flagless = table(tmp_path, "flagless")
    rows = transitions([3])
    rows["next", "done"] = rows["next", "terminated"] = torch.zeros(3, 1, dtype=torch.bool)
    flagless.extend(rows)
    parquet = flagless.export(tmp_path / "flagless.parquet")
    with pytest.raises(SchemaError, match="no episode boundary"):
        write_minari(parquet, root, "ns/deep/name-v0")
    assert not root.exists()
    empty = table(tmp_path, "empty").export(tmp_path / "empty.parquet")
    with pytest.raises(SchemaError, match="table 'empty' holds no rows"):
        write_minari(empty, root, "ns/empty-v0")
    assert not root.exists()


def test_a_missing_dataset_lists_a_few_and_the_walk_reads_what_it_can(tmp_path: Path) -> None:
    """A wrong datasets root (``--dataset-id x/y-v0 /``, a home folder) was walked with
    ``rglob("data")``: every folder named ``data`` was listed, and a root holding ``/proc``
    raised a raw OSError (``Invalid argument: '/proc/<pid>/task/<pid>/net'``)."""
    for i in range(25):
        (tmp_path / "ns" / f"d{i:02d}-v0" / "data").mkdir(parents=True)
        (tmp_path / "ns" / f"d{i:02d}-v0" / "data" / "metadata.json").write_text("{}")
    (tmp_path / "code" / "data").mkdir(parents=True)  # not a dataset
    (tmp_path / ".cache" / "old-v0" / "data").mkdir(parents=True)
    (tmp_path / ".cache" / "old-v0" / "data" / "metadata.json").write_text("{}")
    listed = r"\(there: ns/d00-v0, ns/d01-v0, .*, ns/d19-v0, and 5 more\)"
    with pytest.raises(InvalidRequest, match=rf"no Minari dataset 'x/y-v0' under .*{listed}"):
        read_minari(tmp_path, "x/y-v0", FIELDS)
    with pytest.raises(InvalidRequest, match=r"no Minari dataset 'x/y-v0' under '/proc'"):
        read_minari("/proc", "x/y-v0", FIELDS)
