"""A dataset made elsewhere reads only its own files.

A Minari dataset is a folder of files another tool wrote, as untrusted as a
request body, and both its formats can point outside it: a symbolic link in
the folder (``data`` or ``main_data.hdf5`` linked to any file), and in HDF5
an external link (``/episode_0/observations`` naming a dataset in another
file), a virtual dataset mapping another file's dataset, or a dataset whose
raw storage is declared *external* (any file's bytes, ``/etc/shadow`` or a
private key, read as its values). h5py and Minari follow all of them without
a word, so the import would copy another file's contents into a table that
others sample. :func:`check_inside` refuses each before Minari opens the
dataset; a dataset Minari wrote holds none of them.
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py

from .errors import InvalidRequest

__all__ = ["check_inside"]


def check_inside(folder: Path, dataset_id: str) -> None:
    """Refuse a dataset folder whose files reach outside it.

    Args:
        folder: the dataset's folder (``root/dataset_id``); it may itself be a link,
            what it resolves to is the dataset.
        dataset_id: the dataset's id, for the error.

    Raises:
        InvalidRequest: a symbolic link under ``folder`` resolves outside it, or an HDF5
            file in it holds an external link, external raw storage or a virtual dataset
            drawing on another file (the error names the file and the object).
    """
    inside = folder.resolve()
    for parent, subfolders, files in os.walk(inside):
        for name in [*subfolders, *files]:
            path = Path(parent, name)
            if path.is_symlink() and not path.resolve().is_relative_to(inside):
                _refuse(dataset_id, f"{path} links to {os.readlink(path)!r}, outside the dataset")
        for name in files:
            path = Path(parent, name)
            if h5py.is_hdf5(path):
                _check_hdf5(path, dataset_id)


def _check_hdf5(path: Path, dataset_id: str) -> None:
    # HDF5's own walks (h5py's visititems_links looks each link up twice by name: 7 s for a
    # dataset of 10,000 episodes that Minari reads in 12 s, 3 s this way); each stops at the first
    # answer that is not None (an exception raised in the callback breaks h5py's lock
    # instead of reaching the caller)
    with h5py.File(path, "r") as f:
        why = f.id.links.visit(
            lambda name, info: _link_outside(f, name, info), info=True
        ) or h5py.h5o.visit(f.id, lambda name, info: _dataset_outside(f, name, info), info=True)
    if why is not None:
        _refuse(dataset_id, f"{path}: {why}")


def _link_outside(f: h5py.File, name: bytes, info: h5py.h5l.LinkInfo) -> str | None:
    """Why the link ``name`` leads out of its file; ``None`` when it does not (a hard link,
    or a soft link, which names an object of the same file)."""
    if info.type == h5py.h5l.TYPE_EXTERNAL:
        file, _ = f.id.links.get_val(name)
        return f"{_text(name)!r} is an external link to {_text(file)!r}"
    if info.type not in (h5py.h5l.TYPE_HARD, h5py.h5l.TYPE_SOFT):
        return f"{_text(name)!r} is a user-defined link"
    return None


def _dataset_outside(f: h5py.File, name: bytes, info: h5py.h5o.ObjInfo) -> str | None:
    """Why the object ``name`` draws its values from another file; ``None`` when it does not."""
    if info.type != h5py.h5o.TYPE_DATASET:
        return None
    plist = h5py.h5d.open(f.id, name).get_create_plist()
    shown = repr(_text(name))
    if plist.get_external_count():
        files = {_text(plist.get_external(i)[0]) for i in range(plist.get_external_count())}
        return f"{shown} stores its values in {', '.join(sorted(files))}"
    if plist.get_layout() == h5py.h5d.VIRTUAL:
        files = {plist.get_virtual_filename(i) for i in range(plist.get_virtual_count())} - {"."}
        if files:
            return f"{shown} is a virtual dataset of {', '.join(sorted(files))}"
    return None


def _text(name: bytes) -> str:
    return name.decode(errors="replace")


def _refuse(dataset_id: str, why: str) -> None:
    raise InvalidRequest(
        f"the Minari dataset {dataset_id!r} reaches outside its folder: {why}",
        field="dataset_id",
        got=dataset_id,
    )
