"""``tdreplay export --checkpoint`` / ``--root`` restore a checkpoint to export it: the table
its ``metadata.json`` declares is bounded by ``--max-table-bytes``, as a server bounds it.

A checkpoint's spec is a few bytes of JSON and is untrusted; the table it declares is
allocated whole (its per-slot bookkeeping in memory) before a row is read. Before, an offline
export allocated whatever was declared: 1.26 GB of memory for a 28 KB checkpoint of 2 rows
declaring 33M slots, growing with the declared capacity up to what the kernel refuses.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from testkit import make_spec, rows
from testkit import run_cli as tdreplay_cli

from tdreplay.service import Settings
from tdreplay.storage import Table

GIB = 1 << 30


def declaring(root: Path, capacity: int) -> Path:
    """A real checkpoint of 2 rows at ``<root>/checkpoints/t`` whose spec declares ``capacity``."""
    table = Table.create(make_spec("t", capacity=4), root / "made")
    table.extend(rows(0, 2))
    path = table.checkpoint(root / "checkpoints" / "t")
    table.destroy()
    meta = json.loads((path / "metadata.json").read_text())
    meta["spec"]["capacity"] = capacity
    (path / "metadata.json").write_text(json.dumps(meta))
    return path


#: runs ``tdreplay`` and, at its exit, writes its own peak RSS (``VmHWM``, of the process
#: image the CLI ran in) last on stderr: the child's ``ru_maxrss`` would count the pages of the
#: test process it was forked from before its exec
_MEASURED = (
    "import atexit, runpy, sys\n"
    "def peak():\n"
    "    hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
    "    print('\\nPEAK', int(hwm.split()[1]) >> 10, file=sys.stderr)\n"
    "atexit.register(peak)\n"
    "sys.argv = ['tdreplay', *sys.argv[1:]]\n"
    "runpy.run_module('tdreplay.cli', run_name='__main__')\n"
)


def export(*argv: str) -> tuple[int, str, int]:
    """``tdreplay export *argv`` in a process of its own: exit status, stderr, peak RSS (MB)."""
    child = subprocess.run(
        [sys.executable, "-c", _MEASURED, "export", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        check=False,
    )
    err, _, peak = child.stderr.decode().rpartition("\nPEAK ")
    return child.returncode, err, int(peak)


def test_a_checkpoint_declaring_a_table_past_the_limit_is_refused_before_it_is_allocated(
    tmp_path: Path,
) -> None:
    path = declaring(tmp_path, 1 << 26)  # 64M slots: gigabytes of bookkeeping
    out = tmp_path / "out" / "t.parquet"
    code, err, peak = export(
        "--checkpoint", str(path), "-o", str(out), "--max-table-bytes", str(GIB)
    )
    assert code == 1, err
    assert "capacity 67108864" in err and f"limit of {GIB} bytes (--max-table-bytes)" in err, err
    assert peak < 700, f"{peak} MB"  # the interpreter, torch and tensordict: ~400 MB
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no file, no scratch
    # the same table under a data root, found as its checkpoint
    code, err, _ = export(
        "t", "--root", str(tmp_path), "-o", str(out), "--max-table-bytes", str(GIB)
    )
    assert code == 1 and "(--max-table-bytes)" in err, err


def test_the_default_limit_is_the_server_s(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = declaring(tmp_path, 1 << 40)  # the most a spec may declare
    out = tmp_path / "t.parquet"
    code, _, err = tdreplay_cli(
        "export", "--checkpoint", str(path), "-o", str(out), capsys=capsys, monkeypatch=monkeypatch
    )
    limit = Settings().max_table_bytes
    assert code == 1 and f"limit of {limit} bytes (--max-table-bytes)" in err, err
    assert not out.exists()
    code, _, err = tdreplay_cli(
        "export", "--checkpoint", str(path), "-o", str(out), "--max-table-bytes", "0",
        capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert code == 2 and "--max-table-bytes is 0" in err, err


def test_a_checkpoint_within_the_limit_exports_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = declaring(tmp_path, 1000)
    out = tmp_path / "t.parquet"
    code, stdout, err = tdreplay_cli(
        "export", "--checkpoint", str(path), "-o", str(out), "--max-table-bytes", str(GIB),
        capsys=capsys, monkeypatch=monkeypatch,
    )  # fmt: skip
    assert code == 0 and "2 rows" in stdout, err
