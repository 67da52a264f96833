"""What the deployment tests share: the CLI's flags and environment variables, read from the code.

Imported as ``from deploykit import ...`` (the test folders are on pytest's path).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path
from typing import Any

from tdreplay.cli.serve import ENV_ONLY, build_parser, env_var
from tdreplay.service import Settings

REPO = Path(__file__).resolve().parents[2]


def serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["serve"]


def serve_flags() -> set[str]:
    """Every option string ``tdreplay serve`` takes (``--port``, ``--no-restore``, ...)."""
    return {s for a in serve_parser()._actions for s in a.option_strings}


def env_vars() -> set[str]:
    """Every ``TDREPLAY_*`` variable the server reads (the token's included)."""
    return {env_var(name) for name in Settings.model_fields}


def settings_from_env(env: dict[str, str], monkeypatch: Any, **replace: str) -> Settings:
    """The :class:`Settings` a server started with exactly ``env`` (plus ``replace``) gets."""
    for name in env_vars() | {"TDREPLAY_TOKEN"}:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**env, **replace}.items():
        if name.startswith("TDREPLAY_"):
            monkeypatch.setenv(name, value)
    return Settings()


def parse_serve(argv: list[str]) -> dict[str, Any]:
    """``tdreplay *argv`` parsed (must be ``serve [flags]``); argparse errors raise SystemExit."""
    args = vars(build_parser().parse_args(argv))
    assert args.pop("command") == "serve", argv
    return args


def torch_pin() -> str:
    """The torch version the Makefile installs (``torch==X``)."""
    found = set(re.findall(r'"torch==([0-9.]+)"', (REPO / "Makefile").read_text()))
    assert len(found) == 1, found
    return found.pop()


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


__all__ = ["ENV_ONLY", "REPO"]
