"""``tdreplay serve``: run the server (also ``python -m tdreplay.service serve``).

The other ``tdreplay`` commands drive a running server or read a data root
without one; they live in :mod:`tdreplay.cli`, above the service and the
client. What every command shares lives here, below them: the exit statuses
(:class:`Exit`), the one-line error (:class:`CommandError`) and the one
mapping of failures to both (:func:`run_command`).

Every ``serve`` flag is a field of :class:`~tdreplay.service.settings.Settings`
with an environment twin, ``TDREPLAY_<FLAG>`` (``--max-body-bytes`` ->
``TDREPLAY_MAX_BODY_BYTES``); a flag wins over its variable. ``--schema``
takes files, folders, or the names of shipped schemas (``cartpole``); a list
flag given again adds to its list (``--schema a.yaml --schema b.yaml``).
There is no ``--token`` flag: ``ps`` shows a command line to every user of
the host.

Exit status (:class:`Exit`): 0 done; 1 the operation failed (the message
says why: the server's or the storage's error); 2 bad usage; 3 no server
answered at the URL; 4 the server refused the token; 130 interrupted.

    $ tdreplay serve --schema schemas/ --root ./data --host 0.0.0.0 --token-file /run/secrets/token
"""

from __future__ import annotations

import argparse
import enum
import logging
import os
import sys
import typing
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from pydantic import ValidationError

from tdreplay import schemas
from tdreplay.storage import TDReplayError

from . import runner, tuning
from .app import VERSION, create_app
from .core import load_specs
from .settings import Settings

log = logging.getLogger("tdreplay.service")

#: flags whose name differs from their settings field
FLAG_NAMES = {"schema_path": "schema"}

#: settings fields with no flag (a secret on the command line shows in ``ps``)
ENV_ONLY = frozenset({"token"})


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


def version() -> str:
    try:
        return metadata.version("tdreplay")
    except metadata.PackageNotFoundError:  # run from a source tree that is not installed
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
        help_text = f"{field.description} [env {env_var(name)}; default: {shown}]"
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
                kwargs["choices"] = choices  # shown as {a,b,...}: the help need not list them
            else:
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
    """``settings`` with each ``schema_path`` that does not exist resolved to a shipped schema.

    ``--schema cartpole`` (or ``schemas/cartpole.yaml``, ``schemas/`` run from
    outside a checkout) serves the schema installed with tdreplay.
    """
    paths = [p if p.exists() else schemas.resolve(p) for p in settings.schema_path]
    if paths == settings.schema_path:
        return settings
    return settings.model_copy(update={"schema_path": paths})


def serve(settings: Settings) -> None:
    """Run the server until interrupted (uvicorn with the limits of :mod:`.server`)."""
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    shipped = with_shipped_schemas(settings)
    if shipped is not settings:
        log.info("serving the shipped schema(s) %s", shipped.schema_path)
    load_specs(shipped)  # a bad schema stops here, with its message, before the server starts
    tuning.pin_malloc(shipped.malloc_mmap_threshold, shipped.malloc_trim_threshold)
    runner.run(create_app(shipped), shipped)


# ---------------------------------------------------------------- the parser
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


def add_serve_command(sub: Any) -> None:
    """The ``serve`` command and its flags."""
    serve_parser = sub.add_parser(
        "serve",
        help="run the HTTP server",
        description="Serve the tables of a schema file or folder over HTTP (FastAPI + uvicorn).",
        epilog="The bearer token comes from TDREPLAY_TOKEN or --token-file, never from a flag. "
        "A --host other than loopback (127.0.0.0/8, ::1, localhost) needs a token or --insecure.",
    )
    add_settings_flags(serve_parser)


def build_parser() -> argparse.ArgumentParser:
    """``python -m tdreplay.service``'s parser: ``serve`` only (``tdreplay`` has them all)."""
    parser = new_parser()
    add_serve_command(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    return parser


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


def run_serve(args: dict[str, Any]) -> None:
    """``tdreplay serve`` with parsed flags; invalid settings raise :class:`CommandError`."""
    try:
        settings = settings_from_args(args)
    except ValidationError as err:
        raise CommandError(f"invalid settings: {_settings_problem(err)}") from None
    serve(settings)


def run_command(command: str, call: Callable[[], None]) -> None:
    """Run a command's ``call`` and exit the way every ``tdreplay`` command does: a failure
    is one line on stderr (no traceback) and its :class:`Exit` status."""
    try:
        call()
    except CommandError as err:
        if err.code == Exit.FAILED:
            sys.exit(f"tdreplay {command}: {err}")  # printed to stderr, status 1
        print(f"tdreplay {command}: {err}", file=sys.stderr)
        sys.exit(int(err.code))
    except TDReplayError as err:
        sys.exit(f"tdreplay {command}: {err}")
    except BrokenPipeError:  # `tdreplay info t | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(Exit.OK))
    except OSError as err:  # a file of the command's: unreadable, unwritable, missing
        where = f" {str(err.filename)!r}" if err.filename else ""
        sys.exit(f"tdreplay {command}:{where} {err.strerror or err}")
    except KeyboardInterrupt:
        print(f"tdreplay {command}: interrupted", file=sys.stderr)
        sys.exit(int(Exit.INTERRUPTED))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m tdreplay.service serve ...``."""
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    run_command("serve", lambda: run_serve(args))
