"""Minari datasets declaring wide steps, against a real server: a few KB of HDF5 can declare
observations of ``(T, 10**6)`` values (never written: HDF5 reads them as zeros), and a few
hundred KB of JPEG a frame of 8000 x 8000 pixels. The importing process read a chunk of such
steps (400 MB for 100 of them) or decoded every frame (64 MB each) before the table's
fields refused them. Now each part's values per step are checked against the table's field
before a value is read (a part no field reads: at most a row of the table), and each JPEG
frame's size from its header before it is decoded. Peak memory is measured in a fresh
process, as :mod:`test_datasets_declared_sizes` does."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import gymnasium as gym
import h5py
import minari
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasetkit import make_table
from PIL import Image
from test_datasets_declared_sizes import GROWTH_MB, measured
from test_datasets_hostile import FIELDS, episode, write

from tdreplay.client import ReplayClient

WIDE = 1_000_000  # float32 values a step: 4 MB; the 101 steps of the episode: 400 MB
FRAME = (64, 64)  # the space's (and the table's) frames, grayscale
BIG = 8000  # a JPEG frame's side in pixels: 64 MB decoded, ~1 MB of file


def wide(root: Path, dataset_id: str, where: str) -> None:
    """A dataset of one 100-step episode whose ``where`` declares ``WIDE`` values a step."""
    write(root, dataset_id, [episode(100)], observation_space=gym.spaces.Box(-1, 1, (2,)))
    with h5py.File(root / dataset_id / "data" / "main_data.hdf5", "a") as f:
        group = f["episode_0"]
        if where in group:
            del group[where]
        steps = 101 if where == "observations" else 100
        group.create_dataset(where, shape=(steps, WIDE), dtype=np.float32, chunks=True)


def test_a_step_wider_than_the_field_is_refused_before_it_is_read(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    wide(tmp_path, "elsewhere/wide-v0", "observations")
    assert (tmp_path / "elsewhere/wide-v0/data/main_data.hdf5").stat().st_size < 64 * 1024
    name = make_table(client, fields=FIELDS)
    got = measured(server, "client", name, "elsewhere/wide-v0", tmp_path)
    assert got["error"].startswith("SchemaError"), got
    assert (
        f"table field 'observation' has shape [2], but episode 0 holds ({WIDE},) per step"
        in got["error"]
    )
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 0


def test_a_wide_part_no_field_reads_is_refused_before_it_is_read(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    wide(tmp_path, "elsewhere/info-v0", "infos/extra")
    name = make_table(client, fields=FIELDS)
    got = measured(server, "client", name, "elsewhere/info-v0", tmp_path)
    assert got["error"] is not None, got
    row = 2 + 1 + 2 + 1 + 1  # the values of a row of FIELDS
    assert (
        f"episode 0's 'extra' holds {WIDE} values per step, which no field of the table "
        f"reads: at most {row}" in got["error"]
    ), got
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 0


def frames(steps: int) -> np.ndarray:
    return (np.arange(steps * FRAME[0] * FRAME[1]) % 7 * 30).astype(np.uint8).reshape(-1, *FRAME)


def jpeg_dataset(root: Path, dataset_id: str) -> None:
    """Minari's writer's JPEG frames (its default for an image space)."""
    space = gym.spaces.Box(0, 255, FRAME, np.uint8)
    write(root, dataset_id, [episode(3, observations=frames(4))], observation_space=space)


IMAGE_FIELDS = FIELDS | {
    "observation": {"shape": list(FRAME), "dtype": "uint8"},
    "next.observation": {"shape": list(FRAME), "dtype": "uint8"},
}


def test_jpeg_frames_are_decoded_as_minari_decodes_them(
    client: ReplayClient, tmp_path: Path
) -> None:
    jpeg_dataset(tmp_path, "elsewhere/jpeg-v0")
    name = make_table(client, fields=IMAGE_FIELDS)
    assert client.import_dataset(name, "elsewhere/jpeg-v0", root=tmp_path) == 3
    own = next(minari.MinariDataset(tmp_path / "elsewhere/jpeg-v0/data").iterate_episodes())
    rows = pq.read_table(pa.BufferReader(client.export(name))).to_pydict()
    for key, first in (("observation", 0), ("next.observation", 1)):
        got = np.array(rows[key], dtype=np.uint8).reshape(3, *FRAME)
        assert np.array_equal(got, own.observations[first : first + 3]), key


def test_a_jpeg_frame_larger_than_the_space_is_refused_before_it_is_decoded(
    server: Any, client: ReplayClient, tmp_path: Path
) -> None:
    jpeg_dataset(tmp_path, "elsewhere/jbomb-v0")
    buffer = io.BytesIO()
    Image.new("L", (BIG, BIG)).save(buffer, format="JPEG")
    big = np.frombuffer(buffer.getvalue(), dtype=np.uint8)
    assert big.size < 2 << 20
    with h5py.File(tmp_path / "elsewhere/jbomb-v0/data/main_data.hdf5", "a") as f:
        del f["episode_0/observations"]
        f["episode_0"].create_dataset("observations", data=np.stack([big] * 4))
    name = make_table(client, fields=IMAGE_FIELDS)
    got = measured(server, "client", name, "elsewhere/jbomb-v0", tmp_path)
    assert got["error"] is not None, got
    assert f"JPEG frame 0 is {BIG} x {BIG} L" in got["error"], got
    assert f"but the space's frames are {FRAME}" in got["error"], got
    assert got["grown_mb"] < GROWTH_MB, got
    assert client.info(name)["size"] == 0
