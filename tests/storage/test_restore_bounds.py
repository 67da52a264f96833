"""A checkpoint's state is held to what its table can hold, before any of it is loaded.

A checkpoint (or an uploaded dump, restored the same way) is untrusted: its
``state.safetensors`` may declare tensors far larger than the table's state, or tensors
the state does not refer to. They are refused from the file's header, by name, before a
byte of them is read: the tests craft such files (sparse: no disk is spent) and measure
the peak memory of a process that restores them.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from testkit import PEAK, make_spec, rows

from tdreplay.storage import InvalidCheckpoint, Table
from tdreplay.storage import statefile as SF

#: elements of the planted tensor: 256 MiB of bool
HUGE = 256 << 20


def rewrite_state(path: Path, change: dict[str, tuple[str, list[int]] | None]) -> None:
    """Rewrite ``path/state.safetensors`` by hand: each tensor named in ``change`` becomes
    one of that ``(dtype, shape)`` holding zeros (sparse: the file has a hole there), or
    goes (``None``); the others and the state structure stay."""
    file = path / SF.STATE_FILE
    raw = file.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    entries: dict[str, tuple[str, list[int], bytes | int]] = {}
    for name, info in header.items():
        if name != "__metadata__":
            begin, end = info["data_offsets"]
            entries[name] = (info["dtype"], info["shape"], data[begin:end])
    for name, new in change.items():
        if new is None:
            entries.pop(name, None)
        else:
            dtype, shape = new
            count = 1
            for d in shape:
                count *= d
            entries[name] = (dtype, shape, count * {"BOOL": 1, "U8": 1, "I64": 8, "F64": 8}[dtype])
    out: dict[str, object] = {"__metadata__": header["__metadata__"]}
    offset, chunks = 0, []
    for name, (dtype, shape, payload) in entries.items():
        size = payload if isinstance(payload, int) else len(payload)
        out[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        chunks.append(payload)
        offset += size
    text = json.dumps(out).encode()
    text += b" " * (-len(text) % 8)
    with file.open("wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for payload in chunks:
            if isinstance(payload, int):
                f.seek(payload, 1)  # a hole: reads as zeros
            else:
                f.write(payload)
        f.truncate(f.tell())


def restore_peak(path: Path, root: Path) -> tuple[str, int]:
    """Restore ``path`` in a fresh process: the error it raised, and how much its peak RSS grew (bytes)."""
    script = textwrap.dedent(
        f"""
        import sys
        from tdreplay.storage import Table
        before = reset_peak()
        try:
            Table.restore({str(path)!r}, {str(root)!r})
            error = "restored"
        except Exception as err:
            error = f"{{type(err).__name__}}: {{err}}"
        print(peak_growth(before))
        print(error)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", PEAK + script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.splitlines()
    return out[1], int(out[0])


@pytest.mark.parametrize(
    "change, named",
    [
        ({"planted": ("BOOL", [HUGE])}, "planted"),  # a tensor the state does not refer to
        ({"slots.live": ("BOOL", [HUGE])}, "slots.live"),  # one far past the capacity
    ],
    ids=["unreferenced", "oversized"],
)
def test_a_state_past_the_tables_bounds_is_refused_before_it_is_loaded(
    tables, root: Path, tmp_path: Path, change: dict, named: str
) -> None:
    live = tables.create(make_spec(capacity=16), root=root)
    live.extend(rows(0, 12))
    path = live.checkpoint(tmp_path / "ckpt")
    rewrite_state(path, change)
    assert (path / SF.STATE_FILE).stat().st_size > HUGE  # the file declares it all
    error, grew = restore_peak(path, tmp_path / "restored")
    assert grew < HUGE // 4, f"restoring grew the process by {grew >> 20} MiB: {error}"
    assert error.startswith("InvalidCheckpoint") and repr(named) in error, error
    with pytest.raises(InvalidCheckpoint, match=repr(named)):
        Table.restore(path, tmp_path / "again")


def test_a_format_1_state_past_the_tables_bounds_is_refused_before_it_is_loaded(
    tables, root: Path, tmp_path: Path
) -> None:
    """A format 1 ``state.pt`` is refused by its size (``torch.save`` stores tensors
    uncompressed) before ``torch.load`` reads any of it."""
    live = tables.create(make_spec(capacity=16), root=root)
    live.extend(rows(0, 12))
    path = live.checkpoint(tmp_path / "ckpt")
    meta = json.loads((path / "metadata.json").read_text())
    (path / "metadata.json").write_text(json.dumps({**meta, "format_version": 1}))
    (path / SF.STATE_FILE).unlink()
    state = live.state_dict()
    state["planted"] = torch.zeros(4 << 20, dtype=torch.uint8)  # 4 MiB
    torch.save(state, path / "state.pt")
    with pytest.raises(InvalidCheckpoint, match=r"state\.pt \(format 1\) holds \d+ bytes"):
        Table.restore(path, tmp_path / "restored")
    del state["planted"]
    torch.save(state, path / "state.pt")
    assert len(tables.restore(path, root=tmp_path / "again")) == 12  # one of its size restores


@pytest.mark.parametrize("kind", ["memory", "memmap"])
@pytest.mark.parametrize("planted", [float("nan"), 1e9], ids=["nan", "disagrees"])
def test_max_value_ranks_that_disagree_with_the_key_column_are_refused(
    tables, root: Path, tmp_path: Path, kind: str, planted: float
) -> None:
    """A max-value table ranks its items by ``writer.values``, which must be their key: a
    NaN there would outrank every value and never leave; another value would keep the
    wrong items. Both are refused, naming the slot; a checkpoint as written restores."""
    spec = make_spec(capacity=4, backend={"kind": kind}, writer={"kind": "max_value", "key": "id"})
    live = tables.create(spec, root=root)
    live.extend(rows(0, 4))
    path = live.checkpoint(tmp_path / "ckpt")
    state = SF.load_state(path)
    assert sorted(state["writer"]["values"].tolist()) == [0.0, 1.0, 2.0, 3.0]
    slot = int(state["writer"]["values"].argmin())  # the item of id 0
    state["writer"]["values"][slot] = planted  # ranked by `planted`
    SF.save_state(path, state)
    with pytest.raises(InvalidCheckpoint, match=rf"writer\.values.*slot {slot}"):
        tables.restore(path, root=tmp_path / "restored")
    state["writer"]["values"][slot] = 0.0
    SF.save_state(path, state)
    back = tables.restore(path, root=tmp_path / "again")
    back.extend(rows(10, 1))  # the smallest id goes
    assert sorted(back.read(back.live_index())["id"].tolist()) == [1, 2, 3, 10]
