"""The ``tdreplay`` command: ``tdreplay serve [flags]``.

Every flag is a field of :class:`~tdreplay.service.settings.Settings` and has
an environment-variable twin, ``TDREPLAY_<FLAG>`` (``--max-body-bytes`` ->
``TDREPLAY_MAX_BODY_BYTES``); a flag wins over its variable. ``tdreplay serve
--help`` lists them all.

    $ tdreplay serve --schema schemas/ --root ./data --host 0.0.0.0 --port 8000 --token "$TOKEN"
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

from tdreplay.storage.errors import TDReplayError

from .settings import Settings

#: flags whose name differs from their settings field
FLAG_NAMES = {"schema_path": "schema"}


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
        flag = "--" + _flag(name).replace("_", "-")
        default = field.get_default(call_default_factory=True)
        shown = "unset" if default is None else default
        if name == "token":
            shown = "unset"
        help_text = f"{field.description or name} [env {env_var(name)}; default: {shown}]"
        kwargs: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        annotation = field.annotation
        if annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            if typing.get_origin(annotation) is list:
                kwargs["nargs"] = "+"
                annotation = typing.get_args(annotation)[0]
            choices = _choices(annotation)
            if choices:
                kwargs["choices"] = choices
            kwargs["metavar"] = _flag(name).upper()
        parser.add_argument(flag, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tdreplay", description="tdreplay: a replay-buffer service for PyTorch RL."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the HTTP server",
        description="Serve the tables of a schema file or folder over HTTP (FastAPI + uvicorn).",
    )
    add_settings_flags(serve)
    return parser


def settings_from_args(values: dict[str, Any]) -> Settings:
    """Settings from parsed flags, the environment filling in what the flags leave out."""
    return Settings(**values)


def serve(settings: Settings) -> None:
    """Run the server until interrupted (uvicorn with the limits of :mod:`.server`)."""
    from . import server, tuning
    from .app import create_app, load_specs

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
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()
        )
        sys.exit(f"tdreplay {command}: invalid settings: {problems}")
    if command == "serve":
        try:
            serve(settings)
        except TDReplayError as err:
            sys.exit(f"tdreplay serve: {err}")
