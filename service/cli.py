"""The ``tdreplay`` command: ``tdreplay serve [flags]``.

Every flag is a field of :class:`~tdreplay.service.settings.Settings` and has
an environment-variable twin, ``TDREPLAY_<FLAG>`` (``--max-body-bytes`` ->
``TDREPLAY_MAX_BODY_BYTES``); a flag wins over its variable. ``tdreplay serve
--help`` lists them all.

The bearer token is the one setting with no flag: it comes from
``TDREPLAY_TOKEN`` or from a file (``--token-file``), never from the command
line, where ``ps`` shows it to every user of the host. A non-loopback
``--host`` without a token is refused unless ``--insecure`` is given.

    $ tdreplay serve --schema schemas/ --root ./data --host 0.0.0.0 --token-file /run/secrets/token
    $ TDREPLAY_SCHEMA=schemas/ TDREPLAY_PORT=8000 python -m tdreplay.service serve
"""

from __future__ import annotations

import argparse
import logging
import sys
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from tdreplay.storage import TDReplayError

from .settings import Settings

#: flags whose name differs from their settings field
FLAG_NAMES = {"schema_path": "schema"}

#: settings fields with no flag (a secret on the command line shows in ``ps``)
ENV_ONLY = frozenset({"token"})


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tdreplay", description="tdreplay: a replay-buffer service for PyTorch RL."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the HTTP server",
        description="Serve the tables of a schema file or folder over HTTP (FastAPI + uvicorn).",
        epilog="The bearer token comes from TDREPLAY_TOKEN or --token-file, never from a flag. "
        "A --host other than loopback (127.0.0.0/8, ::1, localhost) needs a token or --insecure.",
    )
    add_settings_flags(serve)
    return parser


def settings_from_args(values: dict[str, Any]) -> Settings:
    """Settings from parsed flags, the environment filling in what the flags leave out."""
    return Settings(**values)


def serve(settings: Settings) -> None:
    """Run the server until interrupted (uvicorn with the limits of :mod:`.server`)."""
    from . import server, tuning
    from .app import create_app
    from .core import load_specs

    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    load_specs(settings)  # a bad schema stops here, with its message, before the server starts
    tuning.pin_malloc(settings.malloc_mmap_threshold, settings.malloc_trim_threshold)
    server.run(create_app(settings), settings)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``tdreplay`` console script and of ``python -m tdreplay.service``."""
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    try:
        settings = settings_from_args(args)
    except ValidationError as err:
        problems = "; ".join(
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
        sys.exit(f"tdreplay {command}: invalid settings: {problems}")
    if command == "serve":
        try:
            serve(settings)
        except TDReplayError as err:
            sys.exit(f"tdreplay serve: {err}")
