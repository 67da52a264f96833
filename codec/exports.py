"""What every door asks of an export file's name: the one rule that decides its format.

``Table.export``, the server's export route (a ``path`` under ``exports/``), the
client writing a streamed export into ``dest`` and the ``tdreplay export`` command
all decide with :func:`export_format`, so a name gets the same answer everywhere:

* no format given: the suffix tells it (``.parquet``, ``.pq``, ``.csv``, any case);
  another suffix, or none, is refused;
* a format given: used, unless the suffix is the other format's (``--format csv``
  into ``run.parquet`` is refused: the file would lie about what it holds); a name
  with another suffix (``run.txt``) takes the format given.

    >>> export_format("out.CSV"), export_format("out.bin", "parquet")
    ('csv', 'parquet')
    >>> export_format("out.txt")
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: cannot tell the export format from 'out.txt'; ...
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from pathlib import Path, PosixPath, PurePath
from typing import Any

from .errors import InvalidRequest, PathExists

#: the formats a table exports to as one file
FILE_FORMATS = ("parquet", "csv")
#: the suffixes (lower case) an export's format is told from
SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
#: those suffixes, in the order the errors name them
SUFFIX_NAMES = tuple(sorted(SUFFIXES))


def export_format(path: str | PurePath, format: str | None = None, table: str | None = None) -> str:
    """The format an export to ``path`` writes: ``format``, else the one its suffix names.

    Args:
        path: the file's name (only its suffix is read).
        format: ``"parquet"`` or ``"csv"`` (any case), or ``None``: from the suffix.
        table: the table exported, named in the error.

    Returns:
        ``"parquet"`` or ``"csv"``.

    Raises:
        InvalidRequest: ``format`` is unknown; or it is ``None`` and the suffix names no
            format; or the suffix names the other format.
    """
    name = PurePath(path).name
    told = SUFFIXES.get(PurePath(path).suffix.lower())
    where = f"table {table!r}: " if table else ""
    if format is None:
        if told is None:
            raise InvalidRequest(
                f"{where}cannot tell the export format from {name!r}; name the file "
                f"{', '.join(SUFFIX_NAMES[:-1])} or {SUFFIX_NAMES[-1]}, or give the "
                f"format ({', '.join(FILE_FORMATS)})",
                table=table,
                field="path",
                expected=list(SUFFIX_NAMES),
                got=name,
            )
        return told
    fmt = format.lower()
    if fmt not in FILE_FORMATS:
        raise InvalidRequest(
            f"{where}unknown export format {format!r} (expected one of {', '.join(FILE_FORMATS)})",
            table=table,
            field="format",
            expected=list(FILE_FORMATS),
            got=format,
        )
    if told is not None and told != fmt:
        raise InvalidRequest(
            f"{where}export format {fmt!r} does not match {name!r}, a {told} name "
            f"({', '.join(SUFFIX_NAMES)}); name the file for {fmt}, or leave the format out",
            table=table,
            field="format",
            expected=told,
            got=fmt,
        )
    return fmt


def keep_existing(path: str | Path, table: str | None = None, shown: str | None = None) -> None:
    """Refuse to export into ``path`` if anything is there: the check before the export
    begins (nothing written yet), which :func:`into_place` makes again, atomically, at the
    end. The one rule of an export that must not replace a file: ``Table.export(...,
    replace=False)`` (the server's exports), ``client.export(dest=, replace=False)`` and
    ``tdreplay export -o FILE`` without ``--force``.

    Args:
        path: the export's file.
        table: the table exported, named in the error (if known).
        shown: how the error names the file (default: its name alone; a server does not
            say where its data root is).

    Raises:
        PathExists: something is at ``path`` (a link too, even a dangling one).
    """
    if os.path.lexists(path):
        raise _exists(path, table, shown)


def into_place(
    tmp: Path, path: Path, *, replace: bool, table: str | None, shown: str | None = None
) -> None:
    """Move the export written in ``tmp`` (beside ``path``) to ``path``: a rename, or with
    ``replace`` ``False`` a hard link, which fails if the name exists - so a file that
    appeared there while the export ran is kept, whatever the timing - and ``tmp`` goes.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     (Path(d) / "x.csv").write_text("theirs"); (Path(d) / ".x.tmp").write_text("ours")
        ...     into_place(Path(d) / ".x.tmp", Path(d) / "x.csv", replace=False, table="t")
        Traceback (most recent call last):
        ...
        tdreplay.codec.errors.PathExists: table 't': 'x.csv' exists; this export does not replace a file (choose another path)

    Raises:
        PathExists: ``replace`` is ``False`` and the name is taken (``tmp`` is left to the
            caller, who deletes it).
    """
    if replace:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise _exists(path, table, shown) from None
    except OSError as err:
        if err.errno not in _NO_LINKS:
            raise
        _claim_then_replace(tmp, path, table, shown)  # vfat, exFAT, some SMB and FUSE mounts
        return
    tmp.unlink()


#: what ``link`` raises on a filesystem without hard links
_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


def _claim_then_replace(tmp: Path, path: Path, table: str | None, shown: str | None) -> None:
    """:func:`into_place` where hard links are not to be had: the name is claimed with an
    exclusive create (failing if it is taken, as the link would), then the export replaces
    that empty file of its own."""
    try:
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        raise _exists(path, table, shown) from None
    os.replace(tmp, path)


def _exists(path: str | Path, table: str | None, shown: str | None) -> PathExists:
    name = shown if shown is not None else Path(path).name
    where = f"table {table!r}: " if table else ""
    return PathExists(
        f"{where}{name!r} exists; this export does not replace a file (choose another path)",
        table=table,
        field="path",
        got=name,
    )


class ExportedName(str):
    """The server's path (relative to its data root) an export wrote, with the same
    ``rows``, ``skipped`` and ``splits`` as :class:`ExportedPath` (``None``: not answered)."""

    rows: int | None = None
    skipped: int | None = None
    splits: int | None = None


def counted(value: Any, answer: Mapping[str, Any]) -> Any:
    """``value`` (an :class:`ExportedPath` or :class:`ExportedName`) with the counts of an
    export's answer (``rows``, ``skipped``, ``splits``; headers' strings too) set on it."""
    for key in ("rows", "skipped", "splits"):
        got = answer.get(key)
        if isinstance(got, int | str) and str(got).isdigit():
            setattr(value, key, int(got))
    return value


class ExportedPath(PosixPath):
    """A path an export wrote, a :class:`~pathlib.Path` that also says what went into it.

    ``rows``: the rows written; ``skipped``: rows live when the export began but
    overwritten or removed before they were read (left out); ``splits``: Minari, where an
    episode was split because rows were missing inside it
    (:class:`tdreplay.codec.episodes.EpisodeSplitter`). ``None`` where not known (a path
    made from this one).
    """

    rows: int | None = None
    skipped: int | None = None
    splits: int | None = None

    @classmethod
    def of(
        cls,
        path: str | PurePath,
        *,
        rows: int | None = None,
        skipped: int | None = None,
        splits: int | None = None,
    ) -> ExportedPath:
        """``path`` with what the export wrote to it."""
        out = cls(path)
        out.rows, out.skipped, out.splits = rows, skipped, splits
        return out
