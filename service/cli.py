"""The ``tdreplay`` command: run a server, drive one, or export a table without one.

    tdreplay serve [flags]             run the HTTP server (every flag has a TDREPLAY_* twin)
    tdreplay tables                    list a running server's tables
    tdreplay info TABLE                a table's info, as JSON
    tdreplay create SCHEMA...          create tables from schema files (or shipped names: cartpole)
    tdreplay drop TABLE --yes          delete a table and its data
    tdreplay checkpoint TABLE [PATH]   checkpoint on the server (default checkpoints/TABLE)
    tdreplay restore TABLE [PATH]      restore from a checkpoint on the server
    tdreplay export TABLE -o FILE      stream a Parquet/CSV export here (--on-server PATH: keep it there)
    tdreplay import TABLE SOURCE       extend a table with the rows of Parquet files
    tdreplay export TABLE --root DIR -o FILE          offline, from a data root (no server)
    tdreplay export --checkpoint DIR -o FILE          offline, from a checkpoint folder
    tdreplay --version

The commands that drive a server find it with ``--url`` (or ``TDREPLAY_URL``;
default ``http://127.0.0.1:8000``; repeat it for a sharded set) and send the
token from ``TDREPLAY_TOKEN`` or ``--token-file`` (``TDREPLAY_TOKEN_FILE``).
As for ``serve``, there is no ``--token`` flag: ``ps`` shows a command line to
every user of the host.

Every ``serve`` flag is a field of :class:`~tdreplay.service.settings.Settings`
with an environment twin, ``TDREPLAY_<FLAG>`` (``--max-body-bytes`` ->
``TDREPLAY_MAX_BODY_BYTES``); a flag wins over its variable. ``--schema``
takes a file, a folder, or the name of a shipped schema (``cartpole``).

Exit status (:class:`Exit`): 0 done; 1 the operation failed (the message
says why: the server's or the storage's error); 2 bad usage; 3 no server
answered at the URL; 4 the server refused the token; 130 interrupted.

    $ tdreplay serve --schema schemas/ --root ./data --host 0.0.0.0 --token-file /run/secrets/token
    $ TDREPLAY_URL=http://replay:8000 TDREPLAY_TOKEN_FILE=./token tdreplay export cartpole -o cp.parquet
"""

from __future__ import annotations

import argparse
import logging
import sys
import typing
from collections.abc import Sequence
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from tdreplay.storage import TDReplayError

from .cli_common import CommandError, Exit
from .settings import Settings

log = logging.getLogger("tdreplay.service")

#: flags whose name differs from their settings field
FLAG_NAMES = {"schema_path": "schema"}

#: settings fields with no flag (a secret on the command line shows in ``ps``)
ENV_ONLY = frozenset({"token"})

#: the commands that drive a running server (see :mod:`.cli_remote`)
REMOTE = ("tables", "info", "create", "drop", "checkpoint", "restore", "export", "import")


def version() -> str:
    try:
        return metadata.version("tdreplay")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
        from .app import VERSION

        return VERSION


# ---------------------------------------------------------------- serve
def _flag(field: str) -> str:
    return FLAG_NAMES.get(field, field)


def env_var(field: str) -> str:
    """The environment variable of a settings field (``port`` -> ``TDREPLAY_PORT``)."""
    return "TDREPLAY_" + _flag(field).upper()


def _choices(annotation: Any) -> list[str] | None:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    for arg in args:
        found = _choices(arg)
        if found:
            return found
    return None


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per settings field; a flag not given leaves the field to the environment."""
    for name, field in Settings.model_fields.items():
        if name in ENV_ONLY:
            continue
        flag = "--" + _flag(name).replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = "unset" if default is None else default
        help_text = f"{field.description or name} [env {env_var(name)}; default: {shown}]"
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        annotation = field.annotation
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            if typing.get_origin(annotation) is list:
                kwargs["nargs"] = "+"
                kwargs["action"] = "extend"  # a repeated flag adds to the list
                annotation = typing.get_args(annotation)[0]
            choices = _choices(annotation)
            if choices:
                kwargs["choices"] = choices
            kwargs["metavar"] = _flag(name).upper()
        parser.add_argument(flag, **kwargs)
    refuse_token_flag(parser)


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


def settings_from_args(values: dict[str, Any]) -> Settings:
    """Settings from parsed flags, the environment filling in what the flags leave out."""
    return Settings(**values)


def with_shipped_schemas(settings: Settings) -> Settings:
    """``settings`` with a ``schema_path`` that does not exist resolved to a shipped schema.

    ``--schema cartpole`` (or ``schemas/cartpole.yaml``, ``schemas/`` run from
    outside a checkout) serves the schema installed with tdreplay.
    """
    from tdreplay import schemas

    if settings.schema_path is None or settings.schema_path.exists():
        return settings
    found = schemas.resolve(settings.schema_path)
    if found == settings.schema_path:
        return settings
    return settings.model_copy(update={"schema_path": found})


def serve(settings: Settings) -> None:
    """Run the server until interrupted (uvicorn with the limits of :mod:`.server`)."""
    from . import server, tuning
    from .app import create_app
    from .core import load_specs

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    shipped = with_shipped_schemas(settings)
    if shipped is not settings:
        log.info("serving the shipped schema(s) %s", shipped.schema_path)
    load_specs(shipped)  # a bad schema stops here, with its message, before the server starts
    tuning.pin_malloc(shipped.malloc_mmap_threshold, shipped.malloc_trim_threshold)
    server.run(create_app(shipped), shipped)


# ---------------------------------------------------------------- the parser
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tdreplay",
        description="tdreplay: a replay-buffer service for PyTorch RL.",
        epilog="Exit status: 0 done, 1 the operation failed, 2 bad usage, 3 no server "
        "answered, 4 the token was refused.",
    )
    parser.add_argument("--version", action="version", version=f"tdreplay {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve_parser = sub.add_parser(
        "serve",
        help="run the HTTP server",
        description="Serve the tables of a schema file or folder over HTTP (FastAPI + uvicorn).",
        epilog="The bearer token comes from TDREPLAY_TOKEN or --token-file, never from a flag. "
        "A --host other than loopback (127.0.0.0/8, ::1, localhost) needs a token or --insecure.",
    )
    add_settings_flags(serve_parser)
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
    """The commands of :data:`REMOTE` (their handlers: :mod:`.cli_remote`, :mod:`.cli_offline`)."""
    p = sub.add_parser("tables", help="list the tables of a running server")
    p.add_argument("--json", action="store_true", help="print the server's answer as JSON")
    _connection(p)

    p = sub.add_parser("info", help="a table's info, as JSON")
    p.add_argument("table")
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
    _connection(p)

    p = sub.add_parser("drop", help="delete a table and its data")
    p.add_argument("table")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    _connection(p)

    p = sub.add_parser("checkpoint", help="checkpoint a table on the server")
    p.add_argument("table")
    p.add_argument(
        "path", nargs="?", help="under the server's data root (default: checkpoints/TABLE)"
    )
    _connection(p)

    p = sub.add_parser("restore", help="restore a table from a checkpoint on the server")
    p.add_argument("table")
    p.add_argument(
        "path", nargs="?", help="under the server's data root (default: checkpoints/TABLE)"
    )
    _connection(p)

    p = sub.add_parser(
        "export",
        help="export a table as Parquet or CSV",
        description="Export the live items of a table, oldest first. From a running server "
        "(streamed to -o FILE, or kept on the server with --on-server), or without one from "
        "a data root (--root) or a checkpoint folder (--checkpoint).",
    )
    p.add_argument("table", nargs="?", help="the table (with --checkpoint: the one it holds)")
    p.add_argument("-o", "--output", metavar="FILE", help="the file to write here")
    p.add_argument(
        "--format",
        choices=["parquet", "csv"],
        help="default: from the suffix of FILE, else parquet",
    )
    p.add_argument(
        "--on-server",
        metavar="PATH",
        help="write it on the server instead, under its data root (exports/...)",
    )
    offline = p.add_argument_group("without a server")
    where = offline.add_mutually_exclusive_group()
    where.add_argument(
        "--root",
        metavar="DIR",
        help="a data root no server holds: the table's own files, else its checkpoint",
    )
    where.add_argument("--checkpoint", metavar="DIR", help="a checkpoint folder")
    _progress(p)
    _connection(p)

    p = sub.add_parser(
        "import",
        help="extend a table with the rows of Parquet files",
        description="Read a Parquet file (or a folder of *.parquet files) as written by "
        "`tdreplay export`, and extend TABLE with its rows, CHUNK at a time.",
    )
    p.add_argument("table")
    p.add_argument("source", help="a .parquet file or a folder of them")
    p.add_argument("--chunk", type=int, default=4096, help="rows per extend (default: 4096)")
    _progress(p)
    _connection(p)


# ---------------------------------------------------------------- shared by the commands
# ---------------------------------------------------------------- entry point
def _settings_problem(err: ValidationError) -> str:
    return "; ".join(
        ": ".join(
            part
            for part in (
                ".".join(str(p) for p in e["loc"]),
                e["msg"].removeprefix("Value error, "),
            )
            if part
        )
        for e in err.errors()
    )


def run(command: str, args: dict[str, Any]) -> None:
    """Run one parsed command; failures raise :class:`CommandError`."""
    if command == "serve":
        try:
            settings = settings_from_args(args)
        except ValidationError as err:
            raise CommandError(f"invalid settings: {_settings_problem(err)}") from None
        serve(settings)
    elif command == "export" and (args.get("root") or args.get("checkpoint")):
        from . import cli_offline

        cli_offline.export(args)
    else:
        from . import cli_remote

        cli_remote.run(command, args)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``tdreplay`` console script and of ``python -m tdreplay.service``."""
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    try:
        run(command, args)
    except CommandError as err:
        if err.code == Exit.FAILED:
            sys.exit(f"tdreplay {command}: {err}")  # printed to stderr, status 1
        print(f"tdreplay {command}: {err}", file=sys.stderr)
        sys.exit(int(err.code))
    except TDReplayError as err:
        sys.exit(f"tdreplay {command}: {err}")
    except OSError as err:  # a file of the command's: unreadable, unwritable, missing
        where = f" {str(err.filename)!r}" if err.filename else ""
        sys.exit(f"tdreplay {command}:{where} {err.strerror or err}")
    except KeyboardInterrupt:
        print(f"tdreplay {command}: interrupted", file=sys.stderr)
        sys.exit(int(Exit.INTERRUPTED))
    except BrokenPipeError:  # `tdreplay info t | head`: the reader left; nothing more to say
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(Exit.OK))
