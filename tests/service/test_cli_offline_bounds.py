"""``tdreplay export --checkpoint`` / ``--root``: what an offline export loads follows what the
checkpoint holds, not the capacity its spec declares, and ``--max-table-bytes`` bounds it.

A checkpoint's spec is a few bytes of JSON and is untrusted. An offline export once allocated
whatever it declared (1.26 GB for a 28 KB checkpoint of 2 rows declaring 33M slots), then
refused a declared table past ``--max-table-bytes`` but still restored the checkpoint into a
whole table below it: per-slot bookkeeping (sampler sum trees, slot columns) and rows of the
declared capacity, ~550 MB over the interpreter's ~400 MB for 10 rows in a prioritized table
declaring 8M slots. It now exports straight from the checkpoint's files (its state, its row
files mapped), and the limit counts the rows it holds and the slots ever written.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from testkit import PEAK, make_spec, rows
from testkit import run_cli as tdreplay_cli

from tdreplay.service import Settings
from tdreplay.storage import MAX_TABLE_BYTES, Table, table_nbytes

GIB = 1 << 30
MB = 1 << 20


def declaring(root: Path, capacity: int, n: int = 2, **extra: object) -> Path:
    """A real checkpoint of ``n`` rows at ``<root>/checkpoints/t`` whose spec declares
    ``capacity`` (its state covers the ``n`` slots written, as a table of that capacity's)."""
    table = Table.create(make_spec("t", capacity=max(n, 4), **extra), root / "made")
    table.extend(rows(0, n))
    path = table.checkpoint(root / "checkpoints" / "t")
    table.destroy()
    meta = json.loads((path / "metadata.json").read_text())
    meta["spec"]["capacity"] = capacity
    (path / "metadata.json").write_text(json.dumps(meta))
    return path


def export(*argv: str) -> tuple[int, str, int]:
    """``tdreplay export *argv`` in a fresh process: its exit status, its stderr, and how far
    its peak resident memory grew from just before the command ran (bytes: the interpreter,
    torch and tensordict, ~400 MB, are loaded before; :data:`testkit.PEAK`)."""
    script = textwrap.dedent(
        f"""
        import sys
        from tdreplay.cli import main
        before = reset_peak()
        try:
            main(["export", *{list(argv)!r}])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        print(peak_growth(before), code)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", PEAK + script], capture_output=True, text=True, timeout=300
    )
    assert child.returncode == 0, child.stderr
    growth, code = child.stdout.splitlines()[-1].split()
    return int(code), child.stderr, int(growth)


def test_an_offline_export_s_memory_follows_the_rows_not_the_declared_capacity(
    tmp_path: Path,
) -> None:
    """10 rows of a prioritized table declaring 8M slots cost what they cost in a table
    of 16 slots (an export's own buffers, and pyarrow's: ~18 MB for Parquet, ~48 MB for
    CSV); restored into a whole table first, they cost ~550 MB more."""
    small = declaring(tmp_path / "small", 16, n=10, sampler={"kind": "prioritized"})
    large = declaring(tmp_path / "large", 1 << 23, n=10, sampler={"kind": "prioritized"})
    out = tmp_path / "out"
    for fmt in ("parquet", "csv"):
        grew = {}
        for name, path in (("small", small), ("large", large)):
            code, err, grew[name] = export(
                "--checkpoint", str(path), "-o", str(out / f"{name}.{fmt}")
            )
            assert code == 0, err
        assert grew["large"] - grew["small"] < 8 * MB, f"{fmt}: {grew}"
    assert pq.read_table(out / "large.parquet").column("id").to_pylist() == list(range(10))
    assert (out / "large.csv").read_bytes() == (out / "small.csv").read_bytes()  # 10 rows
    assert (out / "large.csv").read_text().count("\n") == 11
    assert len(list(out.iterdir())) == 4  # and no scratch beside them


def test_a_checkpoint_holding_more_than_the_limit_is_refused_before_its_rows_are_read(
    tmp_path: Path,
) -> None:
    path = declaring(tmp_path, 1 << 26, n=200)
    out = tmp_path / "out" / "t.parquet"
    held = table_nbytes(make_spec(), held=(200, 200))  # the rows and their slots' bookkeeping
    limit = held - 1
    code, err, _ = export(
        "--checkpoint", str(path), "-o", str(out), "--max-table-bytes", str(limit)
    )
    assert code == 1, err
    assert "200 rows x" in err and "200 written slots" in err and "capacity 67108864" in err, err
    assert f"limit of {limit} bytes (--max-table-bytes)" in err, err
    assert not out.parent.exists() or not any(out.parent.iterdir())  # no file, no scratch
    # the same table under a data root, found as its checkpoint
    code, err, _ = export(
        "t", "--root", str(tmp_path), "-o", str(out), "--max-table-bytes", str(limit)
    )
    assert code == 1 and "(--max-table-bytes)" in err, err
    # what it holds, exactly: exported
    code, err, _ = export("--checkpoint", str(path), "-o", str(out), "--max-table-bytes", str(held))
    assert code == 0 and pq.read_table(out).num_rows == 200, err


def test_the_default_limit_is_the_server_s(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().max_table_bytes == MAX_TABLE_BYTES
    path = declaring(tmp_path, 1 << 40)  # the most a spec may declare: 2 rows held
    out = tmp_path / "t.parquet"
    code, stdout, err = tdreplay_cli(
        "export", "--checkpoint", str(path), "-o", str(out), capsys=capsys, monkeypatch=monkeypatch
    )
    assert code == 0 and "2 rows" in stdout, err
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
