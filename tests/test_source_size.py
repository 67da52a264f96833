"""Every module of the packages stays focused: at most :data:`MAX_LINES` lines (issue 25's
rule; STYLE.md: split into a package before a file sprawls). A file that grows past it is
split where its parts have names of their own, not trimmed of docstrings."""

from __future__ import annotations

from pathlib import Path

from test_import_cycles import module_files

MAX_LINES = 400


def test_every_module_is_at_most_400_lines() -> None:
    files = module_files()
    assert len(files) > 100  # the walk found the packages
    long = {
        name: n
        for name, path in files.items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines (split them): {long}"


def test_every_benchmark_file_is_at_most_400_lines() -> None:
    """The benchmarks read as the packages do: a file past the limit is split where its
    parts have names of their own (``bench/workers.py``, ``bench/storage_report.py``)."""
    files = sorted((Path(__file__).resolve().parent.parent / "bench").glob("*.py"))
    assert len(files) > 10  # the glob found the benchmarks
    long = {
        p.name: n
        for p in files
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, f"benchmark files over {MAX_LINES} lines (split them): {long}"
