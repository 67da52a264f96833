"""``bench/render_readme.py``, the script that writes the README's benchmark tables: ``--help``
and a mistyped flag change nothing; ``--readme`` rewrites the file it names, and one missing
a table's markers is left as it was."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from testkit import REPO

SCRIPT = REPO / "bench" / "render_readme.py"
README = REPO / "README.md"


def render(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


def test_help_and_a_bad_flag_change_nothing() -> None:
    before = (README.read_bytes(), README.stat().st_mtime_ns)
    proc = render("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: render_readme.py") and "--readme" in proc.stdout
    assert "rendered" not in proc.stdout
    proc = render("--bogus")
    assert proc.returncode == 2 and "unrecognized arguments: --bogus" in proc.stderr
    proc = render("--readme", str(REPO / "no-such-readme.md"))
    assert proc.returncode == 2 and "no-such-readme.md: no such file" in proc.stderr
    assert (README.read_bytes(), README.stat().st_mtime_ns) == before


def test_it_rewrites_the_file_named(tmp_path: Path) -> None:
    before = README.stat().st_mtime_ns
    copy = tmp_path / "README.md"
    text = README.read_text()
    start = text.index("<!-- shm-table -->\n") + len("<!-- shm-table -->\n")
    end = text.index("<!-- /shm-table -->")
    copy.write_text(text[:start] + "STALE-TABLE-BODY\n" + text[end:])
    proc = render("--readme", str(copy))
    assert proc.returncode == 0, proc.stderr
    assert "rendered shm-table" in proc.stdout
    assert (
        "STALE-TABLE-BODY" not in copy.read_text() and copy.read_text().count("| workload |") >= 1
    )
    bare = tmp_path / "bare.md"
    bare.write_text("no markers here\n")
    proc = render("--readme", str(bare))
    assert (
        proc.returncode == 1 and "has no <!-- " in proc.stderr and "nothing written" in proc.stderr
    )
    assert bare.read_text() == "no markers here\n"
    assert README.stat().st_mtime_ns == before
