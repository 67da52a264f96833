"""What the ``tdreplay`` commands share beyond the exit statuses and the one-line error
(:mod:`.exits`): the top parser with ``--version``, the refused ``--token`` flag, how a
flag's value the contract refuses is reported, and the export file helpers. The commands'
modules (:mod:`.serve`, :mod:`.offline`, :mod:`.remote`) import it; it imports none of them.

    >>> from tdreplay.codec.exports import export_format
    >>> with flag_values():
    ...     export_format("out.txt")
    Traceback (most recent call last):
    ...
    tdreplay.cli.exits.CommandError: cannot tell the export format from 'out.txt'; name the file .csv, .parquet or .pq, or give --format (parquet, csv) [field 'path']
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

from tdreplay.codec.errors import InvalidRequest, PathExists
from tdreplay.codec.exports import keep_existing
from tdreplay.codec.minari_files import dataset_folder, env_spec_json
from tdreplay.service.app import VERSION

from .exits import CommandError, Exit


def version() -> str:
    try:
        return metadata.version("tdreplay")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return VERSION


def new_parser() -> argparse.ArgumentParser:
    """The ``tdreplay`` parser with ``--version`` and no command yet."""
    parser = argparse.ArgumentParser(
        prog="tdreplay",
        description="tdreplay: a replay-buffer service for PyTorch RL.",
        epilog="Exit status: 0 done, 1 the operation failed, 2 bad usage, 3 no server "
        "answered, 4 the token was refused.",
    )
    parser.add_argument("--version", action="version", version=f"tdreplay {version()}")
    return parser


def refuse_token_flag(parser: argparse.ArgumentParser) -> None:
    """``--token`` answers with where a token goes instead (never echoing its value)."""
    parser.add_argument(
        "--token",
        nargs="?",
        action=_RefuseToken,
        dest="refused_token",
        default=argparse.SUPPRESS,  # absent, it must not set a token=None over TDREPLAY_TOKEN
        help=argparse.SUPPRESS,
    )


class _RefuseToken(argparse.Action):
    """``--token``: refused, without echoing its value (it would otherwise be in ``ps``)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        parser.error(
            "--token is not accepted: a token on the command line is visible to every user "
            "of the host (ps, /proc/PID/cmdline). Set TDREPLAY_TOKEN in the environment, or "
            "put the token in a file and pass --token-file PATH (TDREPLAY_TOKEN_FILE)"
        )


@contextlib.contextmanager
def flag_values(**flags: str) -> Iterator[None]:
    """Checks of command-line values by the contract's rules (such as
    :func:`tdreplay.codec.exports.export_format`): an ``InvalidRequest`` inside is a usage
    error (:class:`CommandError`, exit 2), its message naming the flag (``--format``): the
    one way a command turns a refused value into its usage error. An ``ImportError`` inside
    is one too: the flag asks for an extra that is not installed (minari, gymnasium).

        >>> from tdreplay.codec.protocol import import_chunk
        >>> with flag_values(chunk="--chunk"):
        ...     import_chunk(0)
        Traceback (most recent call last):
        ...
        tdreplay.cli.exits.CommandError: --chunk must be an integer >= 1, got 0

    Args:
        flags: the flag that gave each field's value (``chunk="--chunk"``): where the
            message names the field it names the flag instead.
    """
    try:
        yield
    except InvalidRequest as err:
        message = str(err).replace("give the format", "give --format")
        flag = flags.get(err.field or "")
        if flag is not None and err.field:
            message = re.sub(rf"\b{re.escape(err.field)}\b", flag, message, count=1)
        raise CommandError(message, Exit.USAGE) from None
    except ImportError as err:  # the message says what to install
        raise CommandError(str(err), Exit.USAGE) from None


def minari_id(args: dict[str, Any]) -> str:
    """``--dataset-id``, which a Minari export or import needs."""
    if not args.get("dataset_id"):
        raise CommandError("--format minari needs --dataset-id NAMESPACE/NAME-v0", Exit.USAGE)
    return str(args["dataset_id"])


def minari_flags(args: dict[str, Any]) -> tuple[str, str | None]:
    """``--dataset-id`` and ``--env-spec`` of a Minari export, checked by the contract's
    rules before anything is read or sent, with or without a server: the dataset id, and
    the environment spec's JSON (``None``: none given).

    Raises:
        CommandError: (exit 2) no ``--dataset-id``; a malformed one or ``--env-spec`` (the
            message names the flag); gymnasium missing for ``--env-spec``.
    """
    dataset_id = minari_id(args)
    with flag_values(dataset_id="--dataset-id", env_spec="--env-spec"):
        dataset_folder(".", dataset_id)  # the id's one rule; where it lies is the caller's
        return dataset_id, env_spec_json(args.get("env_spec"))


def replacing(args: dict[str, Any]) -> bool:
    """``--force``: an export's ``-o FILE`` may replace a file there (refused by default)."""
    return bool(args.get("force"))


@contextlib.contextmanager
def kept(output: Path, args: dict[str, Any]) -> Iterator[None]:
    """An export into the local file ``output``: without ``--force``, a file there is
    refused before anything is read or sent, and one that appears meanwhile at the rename
    (:func:`tdreplay.codec.exports.into_place`), either way left as it was; the refusal
    is one line naming the file and ``--force`` (exit 1).

        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile(suffix=".csv") as there, kept(Path(there.name), {}):
        ...     pass  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        tdreplay.cli.exits.CommandError: ....csv exists; give --force to replace it (nothing was written)
    """
    try:
        if not replacing(args) and not output.is_dir():  # a folder: the export's to refuse
            keep_existing(output)
        yield
    except PathExists as err:
        if err.answered:  # the server's own path, not this file
            raise
        raise CommandError(
            f"{output} exists; give --force to replace it (nothing was written)"
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
