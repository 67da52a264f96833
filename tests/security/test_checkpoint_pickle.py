"""Nothing read from a checkpoint folder can run code.

Every file of a checkpoint that something could deserialise (``metadata.json``,
the state file, every ``meta.json`` under ``storage/``, a ``state.pt`` of the
format 1 path, TensorDict's ``other.pickle`` sidecars) is replaced by, or
planted as, a pickle whose ``__reduce__`` creates a marker file. Restoring
must be refused (or, for files we never deserialise, succeed as if they were
not there), and the marker must never appear: through the storage API, over
HTTP (``POST /v1/tables/{name}/restore``) and at start (``tdreplay serve
--restore``).
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from testkit import make_spec, rows

from tdreplay.codec import protocol
from tdreplay.storage import InvalidCheckpoint, Table, TableSpec

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SCHEMAS = REPO / "schemas"
sys.path.insert(0, str(TESTS / "service"))  # the service tests' helpers (not a package)
from service_helpers import body, spec  # noqa: E402


class Payload:
    """Unpickling it runs ``touch <marker>``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def pickled(marker: Path) -> bytes:
    return pickle.dumps({"state": Payload(marker)})


def torch_saved(marker: Path, path: Path) -> None:
    """A ``torch.save`` file whose unpickling (``weights_only=False``) runs the payload."""
    torch.save({"slots": Payload(marker)}, path)


def test_the_payload_works(tmp_path: Path) -> None:
    """The control: unpickled without care, each payload does run (so the tests below mean something)."""
    marker = tmp_path / "MARKER"
    pickle.loads(pickled(marker))
    assert marker.exists()
    marker.unlink()
    torch_saved(marker, tmp_path / "state.pt")
    torch.load(tmp_path / "state.pt", weights_only=False)
    assert marker.exists()


# ---------------------------------------------------------------- checkpoints to poison
def ted_batches(*sizes: int) -> list[Any]:
    """TED-layout CartPole-like steps, as a collector emits them (the checkpoint tests' stream)."""
    sys.path.insert(0, str(TESTS / "storage"))
    from test_checkpoint import TedStream

    stream = TedStream(seed=3)
    return [stream.take(n) for n in sizes]


def write_checkpoint(tmp_path: Path, layout: str) -> tuple[Table, Path]:
    """A table and its checkpoint: the plain layout, or TorchRL's flat TED layout."""
    if layout == "plain":
        table = Table.create(make_spec(capacity=16), root=tmp_path / "live")
        table.extend(rows(0, 12))
    else:
        base = TableSpec.from_file(SCHEMAS / "cartpole.yaml").model_dump(mode="json")
        flat_spec = TableSpec.model_validate(
            {
                **base,
                "capacity": 24,
                "backend": {"kind": "memory"},
                "checkpoint": {"ted2flat": True},
            }
        )
        table = Table.create(flat_spec, root=tmp_path / "live")
        for batch in ted_batches(20, 10):  # wraps: the full-ring path of TED2Flat
            table.extend(batch)
    table.sample(4)
    return table, table.checkpoint(tmp_path / "ckpt")


def deserialisable(path: Path) -> list[Path]:
    """Every file of the checkpoint but the raw ``.memmap`` rows (those are bytes, never parsed)."""
    found = sorted(p.relative_to(path) for p in path.rglob("*") if p.is_file())
    assert found, "an empty checkpoint"
    return [p for p in found if p.suffix != ".memmap"]


def restore(path: Path, tmp_path: Path, tag: str) -> Table:
    return Table.restore(path, root=tmp_path / f"restored-{tag}")


@pytest.mark.parametrize("layout", ["plain", "ted2flat"])
def test_every_parsed_file_replaced_by_a_pickle_is_refused(tmp_path: Path, layout: str) -> None:
    table, ckpt = write_checkpoint(tmp_path, layout)
    files = deserialisable(ckpt)
    names = {p.name for p in files}
    assert {"metadata.json", "state.safetensors", "meta.json"} <= names, names
    if layout == "ted2flat":  # TED2Flat's non-tensor entries are folders with a meta.json
        assert {Path("storage/is_full/meta.json"), Path("storage/shift/meta.json")} <= set(files)
    marker = tmp_path / "MARKER"
    for i, rel in enumerate(files):
        poisoned = tmp_path / f"poisoned-{i}"
        shutil.copytree(ckpt, poisoned)
        (poisoned / rel).write_bytes(pickled(marker))
        with pytest.raises(InvalidCheckpoint) as info:
            restore(poisoned, tmp_path, str(i))
        assert not marker.exists(), f"{rel}: the payload ran"
        assert rel.name in str(info.value) or "metadata" in str(info.value), (rel, info.value)
    # the untouched checkpoint restores
    restored = restore(ckpt, tmp_path, "clean")
    assert len(restored) == len(table)


@pytest.mark.parametrize("layout", ["plain", "ted2flat"])
def test_planted_pickle_sidecars_are_never_read(tmp_path: Path, layout: str) -> None:
    """``other.pickle`` (what ``TensorDict.load_memmap`` unpickles for a non-tensor entry) is ignored."""
    table, ckpt = write_checkpoint(tmp_path, layout)
    marker = tmp_path / "MARKER"
    folders = [ckpt / "storage", *(p for p in (ckpt / "storage").rglob("*") if p.is_dir())]
    for folder in folders:
        (folder / "other.pickle").write_bytes(pickled(marker))
    (ckpt / "other.pickle").write_bytes(pickled(marker))
    restored = restore(ckpt, tmp_path, "sidecars")
    assert not marker.exists()
    live = table.live_index()
    assert restored.live_index().tolist() == live.tolist()
    got, want = restored.read(live), table.read(live)
    for key in want.keys(True, True):
        assert torch.equal(got.get(key), want.get(key)), key


def test_raw_rows_holding_a_pickle_are_just_bytes(tmp_path: Path) -> None:
    """A ``.memmap`` file is mapped as raw values of the spec's dtype, never parsed."""
    _, ckpt = write_checkpoint(tmp_path, "plain")
    marker = tmp_path / "MARKER"
    target = ckpt / "storage" / "pixels.memmap"  # 12 rows of 2x2 uint8: 48 bytes
    payload = pickled(marker)
    data = (payload * (target.stat().st_size // len(payload) + 1))[: target.stat().st_size]
    target.write_bytes(data)
    restored = restore(ckpt, tmp_path, "raw")
    assert not marker.exists()
    got = restored.read(torch.arange(12))["pixels"]
    assert bytes(got.reshape(-1).tolist()) == data


def test_a_planted_state_pt_is_refused(tmp_path: Path) -> None:
    """A format 2 checkpoint never holds ``state.pt``: one there was planted."""
    _, ckpt = write_checkpoint(tmp_path, "plain")
    marker = tmp_path / "MARKER"
    torch_saved(marker, ckpt / "state.pt")
    with pytest.raises(InvalidCheckpoint, match=r"state\.pt"):
        restore(ckpt, tmp_path, "planted")
    assert not marker.exists()


def as_format_1(ckpt: Path, state_pt: bytes | None) -> None:
    """Turn a checkpoint into a format 1 one (``state.pt``), with the given ``state.pt`` bytes."""
    meta = json.loads((ckpt / "metadata.json").read_text())
    (ckpt / "metadata.json").write_text(json.dumps({**meta, "format_version": 1}))
    (ckpt / "state.safetensors").unlink()
    if state_pt is not None:
        (ckpt / "state.pt").write_bytes(state_pt)


@pytest.mark.parametrize("how", ["torch.save", "plain pickle"])
def test_a_format_1_state_pt_payload_is_refused(tmp_path: Path, how: str) -> None:
    _, ckpt = write_checkpoint(tmp_path, "plain")
    marker = tmp_path / "MARKER"
    if how == "torch.save":
        torch_saved(marker, tmp_path / "payload.pt")
        as_format_1(ckpt, (tmp_path / "payload.pt").read_bytes())
    else:
        as_format_1(ckpt, pickled(marker))
    with pytest.raises(InvalidCheckpoint, match=r"state.pt \(format 1\) cannot be read safely"):
        restore(ckpt, tmp_path, "v1")
    assert not marker.exists()


def test_a_format_1_checkpoint_without_state_is_refused(tmp_path: Path) -> None:
    _, ckpt = write_checkpoint(tmp_path, "plain")
    as_format_1(ckpt, None)
    with pytest.raises(InvalidCheckpoint, match=r"state\.pt is missing"):
        restore(ckpt, tmp_path, "v1")


def test_symlinks_out_of_the_checkpoint_are_refused(tmp_path: Path) -> None:
    """A row file linked to another file of the host is not read (and so never served)."""
    _, ckpt = write_checkpoint(tmp_path, "plain")
    secret = tmp_path / "secret"
    target = ckpt / "storage" / "pixels.memmap"
    secret.write_bytes(b"s" * target.stat().st_size)
    target.unlink()
    target.symlink_to(secret)
    with pytest.raises(InvalidCheckpoint, match="outside the checkpoint"):
        restore(ckpt, tmp_path, "link")
    inner = ckpt / "storage" / "copy.memmap"
    shutil.copy(secret, inner)
    target.unlink()
    target.symlink_to(inner)  # inside, but still a link: refused too
    with pytest.raises(InvalidCheckpoint, match="symlink"):
        restore(ckpt, tmp_path, "link2")


# ---------------------------------------------------------------- real servers
def test_restore_over_http_of_a_poisoned_checkpoint(live_server: Any, tmp_path: Path) -> None:
    server = live_server()
    headers = {"Content-Type": "application/json"}
    status, _, text = server.request(
        "POST", protocol.TABLES, json.dumps(spec("t", 32)).encode(), headers
    )
    assert status == 201, text
    status, _, text = server.request(
        "POST",
        protocol.table_path("t", "extend"),
        body(0, 10),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200, text
    status, _, text = server.request("POST", protocol.table_path("t", "checkpoint"))
    assert status == 200, text
    ckpt = server.root / protocol.CHECKPOINTS / "t"
    marker = tmp_path / "MARKER"
    for rel in ("state.safetensors", "metadata.json", "storage/meta.json"):
        saved = (ckpt / rel).read_bytes()
        (ckpt / rel).write_bytes(pickled(marker))
        try:
            status, _, text = server.request("POST", protocol.table_path("t", "restore"))
        finally:
            (ckpt / rel).write_bytes(saved)
        assert 400 <= status < 500, (rel, status, text)
        assert json.loads(text)["type"] == "InvalidCheckpoint", (rel, text)
        assert not marker.exists(), f"{rel}: the payload ran in the server"
    torch_saved(marker, ckpt / "state.pt")
    status, _, text = server.request("POST", protocol.table_path("t", "restore"))
    assert 400 <= status < 500 and json.loads(text)["type"] == "InvalidCheckpoint", text
    assert not marker.exists()
    (ckpt / "state.pt").unlink()
    # the table kept serving, and the repaired checkpoint restores
    status, _, text = server.request("GET", protocol.table_path("t"))
    assert status == 200 and json.loads(text)["size"] == 10, text
    status, _, text = server.request("POST", protocol.table_path("t", "restore"))
    assert status == 200, text


@pytest.mark.parametrize("rel", ["state.safetensors", "storage/meta.json"])
def test_serve_restore_of_a_poisoned_checkpoint_is_refused(
    live_server: Any, tmp_path: Path, rel: str
) -> None:
    """``serve --restore`` refuses the poisoned checkpoint, runs nothing, keeps its files, and
    serves the other tables (one bad table does not keep a server down)."""
    root = tmp_path / "data"
    table = Table.create(make_spec(capacity=16), root=tmp_path / "scratch")
    table.extend(rows(0, 5))
    ckpt = table.checkpoint(root / protocol.CHECKPOINTS / "t")
    marker = tmp_path / "MARKER"
    (ckpt / rel).write_bytes(pickled(marker))
    before = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    server = live_server("--restore", root=root)
    status, _, raw = server.request("GET", protocol.TABLES)
    assert status == 200, raw
    listing = json.loads(raw)
    assert listing["tables"] == [] and list(listing["unavailable"]) == ["t"], listing
    why = listing["unavailable"]["t"]
    assert "InvalidCheckpoint" in server.output() or "cannot restore" in why, why
    assert rel.split("/")[-1] in why, why
    server.stop()
    assert not marker.exists(), "the payload ran in the server"
    assert {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == before
