"""A Minari dataset that points outside its folder, against a real server: an HDF5 external
link, a virtual dataset of another file, a dataset whose raw storage is another file (any
file's bytes read as its values), a symbolic link in the dataset's folder. h5py and Minari
followed each, and the import copied the other file's contents into the table (seen: a
"secret" file's bytes as the rows' observations). Each is refused now, naming the file and
the object, and the table gets none of it; a dataset linked in whole under the root is read."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from datasetkit import make_table
from test_datasets_hostile import FIELDS, episode, write
from testkit import run_cli as cli

from tdreplay.client import InvalidRequest, ReplayClient

SECRET = np.full((4, 2), 1234.5)


def hostile(root: Path, how: str) -> str:
    """A dataset of one 3-step episode whose observations are the secret, reached ``how``."""
    dataset_id = f"elsewhere/{how}-v0"
    write(root, dataset_id, [episode(3)])
    data = root / dataset_id / "data"
    outside = root / "outside.h5"
    with h5py.File(outside, "w") as f:
        f["obs"] = SECRET
    (root / "secret.bin").write_bytes(SECRET.tobytes())
    if how == "symlink":
        os.replace(outside, root / "main.h5")
        with h5py.File(root / "main.h5", "a") as f, h5py.File(data / "main_data.hdf5") as ours:
            ours.copy("episode_0", f)  # the episode as it was, its observations the secret
            del f["episode_0/observations"]
            f["episode_0/observations"] = SECRET
        (data / "main_data.hdf5").unlink()
        (data / "main_data.hdf5").symlink_to(root / "main.h5")
        return dataset_id
    with h5py.File(data / "main_data.hdf5", "a") as f:
        group = f["episode_0"]
        del group["observations"]
        if how == "external-link":
            group["observations"] = h5py.ExternalLink(str(outside), "/obs")
        elif how == "external-storage":
            secret = str(root / "secret.bin")
            group.create_dataset("observations", (4, 2), "f8", external=[(secret, 0, 64)])
        else:
            layout = h5py.VirtualLayout((4, 2), "f8")
            layout[:] = h5py.VirtualSource(str(outside), "obs", shape=(4, 2))
            group.create_virtual_dataset("observations", layout)
    return dataset_id


WHY = {
    "external-link": r"'episode_0/observations' is an external link to '.*outside\.h5'",
    "external-storage": r"'episode_0/observations' stores its values in .*secret\.bin",
    "virtual-dataset": r"'episode_0/observations' is a virtual dataset of .*outside\.h5",
    "symlink": r"main_data\.hdf5 links to '.*main\.h5', outside the dataset",
}


@pytest.mark.parametrize("how", list(WHY))
def test_a_dataset_reaching_outside_its_folder_is_refused(
    server: Any, client: ReplayClient, tmp_path: Path, how: str, capsys: Any, monkeypatch: Any
) -> None:
    dataset_id = hostile(tmp_path, how)
    name = make_table(client, fields=FIELDS)
    message = rf"the Minari dataset '{dataset_id}' reaches outside its folder: .*{WHY[how]}"
    with pytest.raises(InvalidRequest, match=message):
        client.import_dataset(name, dataset_id, root=tmp_path)
    code, _, err = cli(
        "import", name, "--format", "minari", "--dataset-id", dataset_id, str(tmp_path),
        capsys=capsys, monkeypatch=monkeypatch, TDREPLAY_URL=server.url,
    )  # fmt: skip
    assert code == 1 and "Traceback" not in err and "reaches outside its folder" in err
    assert client.info(name)["size"] == 0


def test_a_dataset_linked_in_whole_and_its_own_soft_links_are_read(
    client: ReplayClient, tmp_path: Path
) -> None:
    """The boundary is the folder the dataset resolves to: a dataset folder that is itself a
    link (datasets kept on another disk) is read, and so is a soft link inside its file."""
    write(tmp_path / "disk", "elsewhere/far-v0", [episode(3)])
    (tmp_path / "root" / "elsewhere").mkdir(parents=True)
    (tmp_path / "root" / "elsewhere" / "far-v0").symlink_to(tmp_path / "disk" / "elsewhere/far-v0")
    with h5py.File(tmp_path / "disk/elsewhere/far-v0/data/main_data.hdf5", "a") as f:
        f["episode_0/alias"] = h5py.SoftLink("/episode_0/observations")
    name = make_table(client, fields=FIELDS)
    assert client.import_dataset(name, "elsewhere/far-v0", root=tmp_path / "root") == 3
