"""``tdreplay serve``: run the server (also ``python -m tdreplay.service serve``).

The flags become :class:`~tdreplay.service.settings.Settings` and the server
runs from them (:func:`tdreplay.service.runner.run`); what stops it is said
in one line with its exit status (:func:`.exits.run_command`), and the logs
are set up here: the service itself prints nothing and exits nothing.

Every ``serve`` flag is a field of :class:`~tdreplay.service.settings.Settings`
with an environment twin, ``TDREPLAY_<FLAG>`` (``--max-body-bytes`` ->
``TDREPLAY_MAX_BODY_BYTES``); a flag wins over its variable. ``--schema``
takes files, folders, or the names of shipped schemas (``cartpole``); a list
flag given again adds to its list (``--schema a.yaml --schema b.yaml``).
There is no ``--token`` flag: ``ps`` shows a command line to every user of
the host.

    $ tdreplay serve --schema schemas/ --root ./data --host 0.0.0.0 --token-file /run/secrets/token
"""

from __future__ import annotations

import argparse
import logging
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from tdreplay.service import runner
from tdreplay.service.settings import Settings

from .common import new_parser, refuse_token_flag
from .exits import CommandError, run_command

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


def settings_from_args(values: dict[str, Any]) -> Settings:
    """Settings from parsed flags, the environment filling in what the flags leave out."""
    return Settings(**values)


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
    """``tdreplay serve`` with parsed flags, until interrupted.

    Raises:
        CommandError: the flags and the environment make invalid settings.
        SchemaError, OSError, ...: what stops the server (:func:`tdreplay.service.runner.run`).
    """
    try:
        settings = settings_from_args(args)
    except ValidationError as err:
        raise CommandError(f"invalid settings: {_settings_problem(err)}") from None
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    runner.run(settings)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m tdreplay.service serve ...`` (``serve`` is its only command)."""
    args = vars(build_parser().parse_args(argv))
    args.pop("command")
    run_command("serve", lambda: run_serve(args))
