"""What the ``tdreplay`` commands share beyond the exit statuses and the one-line error
(:mod:`tdreplay.service.cli`): how a flag's value the contract refuses is reported, and the
export file helpers. The commands' modules (:mod:`.offline`, :mod:`.remote`) import it; it
imports none of them.

    >>>     >>> with flag_values():
    ...     export_format("out.txt")
    Traceback (most recent call last):
    ...
    tdreplay.service.cli.CommandError: cannot tell the export format from 'out.txt'; name the file .csv, .parquet or .pq, or give --format (parquet, csv)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tdreplay.codec.errors import InvalidRequest
from tdreplay.service.cli import CommandError, Exit


@contextlib.contextmanager
def flag_values() -> Iterator[None]:
    """Checks of command-line values by the contract's rules (such as
    :func:`tdreplay.codec.exports.export_format`): an ``InvalidRequest`` inside is a usage
    error (:class:`CommandError`, exit 2), its message naming the flag (``--format``).
    """
    try:
        yield
    except InvalidRequest as err:
        raise CommandError(
            str(err).replace("give the format", "give --format"), Exit.USAGE
        ) from None


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


def describe_counts(written: Any) -> str:
    """``"; 90 rows written, 10 left out (overwritten or removed during the export)"`` from
    an export's counts (:class:`tdreplay.codec.exports.ExportedPath`), else ``""``."""
    rows, skipped, splits = (getattr(written, k, None) for k in ("rows", "skipped", "splits"))
    if rows is None:
        return ""
    out = (
        f"; {rows} rows written, {skipped or 0} left out (overwritten or removed during the export)"
    )
    if splits:
        out += f"; {splits} episode splits (rows missing inside an episode)"
    return out


def show_progress(args: dict[str, Any]) -> bool:
    """``--progress`` / ``--no-progress``, else whether stderr is a terminal."""
    chosen = args.get("progress")
    return sys.stderr.isatty() if chosen is None else bool(chosen)
