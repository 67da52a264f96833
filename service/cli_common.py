"""What every ``tdreplay`` command shares: exit statuses, the one-line error, export
file helpers. The commands' modules (:mod:`.cli`, :mod:`.cli_offline`, :mod:`.cli_remote`)
import it; it imports none of them.

    >>> export_format(None, "out.CSV"), export_format(None, None)
    ('csv', 'parquet')
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Any


class Exit(enum.IntEnum):
    """The ``tdreplay`` command's exit status."""

    OK = 0
    FAILED = 1  # the server or the storage refused the operation; the message says why
    USAGE = 2  # argparse's own status for a bad command line
    UNREACHABLE = 3  # no server answered at the URL
    UNAUTHORIZED = 4  # the server refused the token (401) or the operation (403)
    INTERRUPTED = 130


class CommandError(Exception):
    """A failure to report as one line, ``tdreplay <command>: <message>``, without a traceback."""

    def __init__(self, message: str, code: Exit = Exit.FAILED) -> None:
        super().__init__(message)
        self.code = code


def export_format(given: str | None, path: str | None) -> str:
    """The export format: as given, else from the file's suffix, else Parquet."""
    if given:
        return given
    return "csv" if Path(path or "").suffix.lower() == ".csv" else "parquet"


def describe_file(path: Path, fmt: str) -> str:
    """``"1000 rows, 1.2 MiB"`` for an export file (rows counted for Parquet only)."""
    import pyarrow.parquet as pq

    size = path.stat().st_size
    shown = f"{size} B" if size < 1024 else f"{size / 1024:.1f} KiB"
    if size >= 1 << 20:
        shown = f"{size / (1 << 20):.1f} MiB"
    if fmt == "parquet":
        return f"{pq.ParquetFile(path).metadata.num_rows} rows, {shown}"
    return shown


def show_progress(args: dict[str, Any]) -> bool:
    """``--progress`` / ``--no-progress``, else whether stderr is a terminal."""
    chosen = args.get("progress")
    return sys.stderr.isatty() if chosen is None else bool(chosen)
