"""The ``tdreplay`` command: run a server, drive one, or export a table without one.

    tdreplay serve [flags]             run the HTTP server (every flag has a TDREPLAY_* twin)
    tdreplay tables                    list a running server's tables
    tdreplay info TABLE                a table's info, as JSON
    tdreplay create SCHEMA...          create tables from schema files (or shipped names: cartpole)
    tdreplay create SCHEMA --name T    the same schema's table under another name
    tdreplay drop TABLE --yes          delete a table and its data
    tdreplay clear TABLE --yes         empty a table (its schema stays)
    tdreplay checkpoint TABLE [PATH]   checkpoint on the server (default checkpoints/TABLE)
    tdreplay restore TABLE [PATH]      restore from a checkpoint on the server
    tdreplay dump TABLE DIR            the table's rows and state into a local folder
    tdreplay load TABLE DIR            restore the table from such a folder
    tdreplay export TABLE -o FILE      stream a Parquet/CSV export here (--on-server PATH: keep it there)
    tdreplay import TABLE SOURCE       extend a table with the rows of Parquet files
    tdreplay export TABLE --root DIR -o FILE          offline, from a data root (no server)
    tdreplay export --checkpoint DIR -o FILE          offline, from a checkpoint folder
    tdreplay export TABLE --format minari --dataset-id NS/NAME-v0 [-o DATASETS_ROOT]
    tdreplay import TABLE --format minari --dataset-id NS/NAME-v0 [DATASETS_ROOT]
    tdreplay --version

The commands that drive a server find it with ``--url`` (or ``TDREPLAY_URL``;
default ``http://127.0.0.1:8000``; repeat it for a sharded set) and send the
token from ``TDREPLAY_TOKEN`` or ``--token-file`` (``TDREPLAY_TOKEN_FILE``).
As for ``serve``, there is no ``--token`` flag: ``ps`` shows a command line to
every user of the host.

This package sits above the service and the client: ``serve`` (:mod:`.serve`:
its flags, then :func:`tdreplay.service.runner.run`), the commands that drive a
server (:mod:`.remote`, through the public client as a user's script would) and
read a data root without one (:mod:`.offline`); what every command shares, the
exit statuses and the one-line error, is :mod:`.exits`.

Exit status (:class:`~.exits.Exit`): 0 done; 1 the operation failed (the message
says why: the server's or the storage's error); 2 bad usage; 3 no server
answered at the URL; 4 the server refused the token; 130 interrupted.

    $ tdreplay serve --schema schemas/ --root ./data --host 0.0.0.0 --token-file /run/secrets/token
    $ TDREPLAY_URL=http://replay:8000 TDREPLAY_TOKEN_FILE=./token tdreplay export cartpole -o cp.parquet
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from tdreplay.system.tempdir import NoTempDir, settle

try:  # before torch, which asks for a temporary directory as it is imported
    settle()
except NoTempDir as err:
    raise SystemExit(f"tdreplay: {err}") from None

from tdreplay.codec.protocol import IMPORT_CHUNK, MAX_BATCH_BYTES
from tdreplay.storage import MAX_TABLE_BYTES

from . import offline, remote
from .common import new_parser, refuse_token_flag
from .exits import run_command
from .serve import add_serve_command, run_serve

__all__ = ["REMOTE", "add_remote_commands", "build_parser", "main", "run"]

#: the commands that drive a running server (see :mod:`.remote`)
REMOTE = (
    "tables", "info", "create", "drop", "clear", "checkpoint", "restore", "dump", "load",
    "export", "import",
)  # fmt: skip


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its positionals may follow its options.

    argparse matches consecutive positionals at once: in ``import TABLE --format minari
    ROOT`` it gives TABLE and an empty optional SOURCE at ``TABLE``, and then refuses
    ``ROOT`` as unrecognized. Options are parsed first here, then the positionals
    (``parse_known_intermixed_args``).
    """

    _intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if self._intermixing:  # the two passes of parse_known_intermixed_args
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser()
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser
    )
    add_serve_command(sub)
    add_remote_commands(sub)
    return parser


def _connection(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument(
        "--url",
        action="append",
        metavar="URL",
        help="the server's URL; repeat it for a sharded set "
        "[env TDREPLAY_URL, comma-separated; default: http://127.0.0.1:8000]",
    )
    group.add_argument(
        "--token-file",
        metavar="PATH",
        help="file holding the bearer token [env TDREPLAY_TOKEN_FILE; or the token itself "
        "in TDREPLAY_TOKEN]",
    )
    group.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for each answer (default: 600; exports of large tables take long)",
    )
    refuse_token_flag(parser)


def _progress(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )


def add_remote_commands(sub: Any) -> None:
    """The commands of :data:`REMOTE` (their handlers: :mod:`.remote`, :mod:`.offline`)."""
    p = sub.add_parser("tables", help="list the tables of a running server")
    p.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    _connection(p)

    p = sub.add_parser("info", help="a table's info, as JSON")
    p.add_argument("table", help="the name of the table to describe")
    _connection(p)

    p = sub.add_parser("create", help="create tables from schema files")
    p.add_argument(
        "schemas", nargs="+", metavar="SCHEMA", help="a YAML/JSON schema file, or a shipped name"
    )
    p.add_argument(
        "--backend",
        choices=["memory", "memmap", "shared", "h5", "redis"],
        help="put the tables on this backend instead of the schema's",
    )
    p.add_argument(
        "--name",
        help="name the table NAME instead of the schema's name (one SCHEMA): a second table "
        "of a schema's fields, e.g. to import into",
    )
    _connection(p)

    p = sub.add_parser("drop", help="delete a table and its data")
    p.add_argument("table", help="the name of the table to delete")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _connection(p)

    p = sub.add_parser("clear", help="empty a table: its rows go, its schema stays")
    p.add_argument("table", help="the name of the table to empty")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _connection(p)

    p = sub.add_parser("checkpoint", help="checkpoint a table on the server")
    p.add_argument("table", help="the name of the table to checkpoint")
    p.add_argument(
        "path", nargs="?", help="under the server's data root (default: checkpoints/TABLE)"
    )
    _connection(p)

    p = sub.add_parser("restore", help="restore a table from a checkpoint on the server")
    p.add_argument("table", help="the name of the table to restore (replaced if it exists)")
    p.add_argument(
        "path", nargs="?", help="under the server's data root (default: checkpoints/TABLE)"
    )
    _connection(p)

    p = sub.add_parser(
        "dump",
        help="save a table's rows and state into a local folder",
        description="Stream a fresh checkpoint of TABLE (rows, sampler and priorities, writer "
        "position, rate-limiter counters) into DIR, a new or empty folder here.",
    )
    p.add_argument("table", help="the name of the table to save")
    p.add_argument("folder", metavar="DIR", help="a new or empty local folder to save it into")
    _progress(p)
    _connection(p)

    p = sub.add_parser(
        "load",
        help="restore a table from a folder `tdreplay dump` wrote",
        description="Replace (or create) TABLE on the server from DIR, sent in parts within "
        "the server's --max-body-bytes (at most its --max-load-bytes in all).",
    )
    p.add_argument("table", help="the name of the table to replace or create")
    p.add_argument("folder", metavar="DIR", help="a local folder that `tdreplay dump` wrote")
    _progress(p)
    _connection(p)

    p = sub.add_parser(
        "export",
        help="export a table as Parquet or CSV",
        description="Export the live items of a table, oldest first. From a running server "
        "(streamed to -o FILE, or kept on the server with --on-server), or without one from "
        "a data root (--root) or a checkpoint folder (--checkpoint).",
    )
    p.add_argument("table", nargs="?", help="the table (with --checkpoint: the one it holds)")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="the file to write here (minari: the datasets root; default: Minari's, "
        "MINARI_DATASETS_PATH or ~/.minari/datasets)",
    )
    p.add_argument(
        "--format",
        choices=["parquet", "csv", "minari"],
        help="default: from the suffix of FILE or PATH (.parquet, .pq, .csv; another is "
        "refused); a suffix of the other format is refused; minari: a Minari dataset "
        "(episodes from the table's trajectory key, else its done flags)",
    )
    p.add_argument("--dataset-id", metavar="ID", help="minari: the dataset's id, NAMESPACE/NAME-v0")
    p.add_argument(
        "--env-spec",
        metavar="SPEC",
        help="minari: the environment for the metadata (a registered id such as "
        "CartPole-v1, or gymnasium's EnvSpec JSON)",
    )
    p.add_argument(
        "--on-server",
        metavar="PATH",
        help="write it on the server instead, under its data root (exports/...)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace a file at -o FILE (refused by default; the export is written beside "
        "it and renamed into place at the end either way)",
    )
    offline = p.add_argument_group("without a server")
    where = offline.add_mutually_exclusive_group()
    where.add_argument(
        "--root",
        metavar="DIR",
        help="a data root no server holds: the table's own files, else its checkpoint",
    )
    where.add_argument("--checkpoint", metavar="DIR", help="a checkpoint folder")
    offline.add_argument(
        "--max-table-bytes",
        type=int,
        default=MAX_TABLE_BYTES,
        metavar="BYTES",
        help="the most an export loads: of a checkpoint, its rows held x item + its slots "
        "written x per-slot bookkeeping; of a table's own files, capacity x (item + "
        "bookkeeping), as a server's flag; more is refused before a row is read "
        f"(default: {MAX_TABLE_BYTES}, 16 GiB)",
    )
    _progress(p)
    _connection(p)

    p = sub.add_parser(
        "import",
        help="extend a table with the rows of Parquet files, or a Minari dataset's steps",
        description="Read a Parquet file (or a folder of *.parquet files) with a column per "
        "field (as `tdreplay export` writes them, or through --map), or the Minari dataset "
        "--dataset-id (--format minari), and extend TABLE with its rows, CHUNK at a time.",
    )
    p.add_argument("table", help="the name of the table to extend")
    p.add_argument(
        "source",
        nargs="?",
        help="a .parquet file or a folder of them (minari: the datasets root; default: "
        "Minari's, MINARI_DATASETS_PATH or ~/.minari/datasets)",
    )
    p.add_argument(
        "--format",
        choices=["parquet", "minari"],
        default="parquet",
        help="what SOURCE holds: Parquet files, or a Minari dataset (default: parquet)",
    )
    p.add_argument(
        "--map",
        action="append",
        metavar="FIELD=COLUMN",
        help="read FIELD from COLUMN (repeat it; default: the column named as the field). "
        "Both are dotted: a nested key (next.observation=next_obs), a struct column's child "
        "(observation=obs.state)",
    )
    p.add_argument(
        "--ignore-extra",
        action="store_true",
        help="skip the file's columns that no field reads (refused by default)",
    )
    p.add_argument("--dataset-id", metavar="ID", help="minari: the dataset's id")
    p.add_argument(
        "--chunk",
        type=int,
        default=IMPORT_CHUNK,
        help=f"rows per extend, at most the table's capacity (default: {IMPORT_CHUNK})",
    )
    p.add_argument(
        "--max-batch-bytes",
        type=int,
        default=MAX_BATCH_BYTES,
        metavar="BYTES",
        help="the most bytes one compressed unit of the files (a Parquet row group's "
        "largest pages, one per column read; a Minari dataset's Arrow record batch) may "
        "decompress to (each page and batch is decompressed whole); a file holding a larger "
        f"one is refused (default: {MAX_BATCH_BYTES}, 32 MiB)",
    )
    _progress(p)
    _connection(p)


def run(command: str, args: dict[str, Any]) -> None:
    """Run one parsed command; failures raise :class:`~.exits.CommandError`."""
    if command == "serve":
        run_serve(args)
    elif command == "export" and (args.get("root") or args.get("checkpoint")):
        offline.export(args)
    else:
        remote.run(command, args)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``tdreplay`` console script and of ``python -m tdreplay.cli``."""
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    run_command(command, lambda: run(command, args))
