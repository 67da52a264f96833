"""The package imports without its optional extras: the datasets extra (gymnasium, minari,
Pillow), Ray and the browser test's Playwright are imported where they are used, so a plain
``pip install tdreplay`` runs the server, the client and the CLI (the wheel check of
``make wheel`` installs it so; this finds a top-level import of one before CI does)."""

from __future__ import annotations

import subprocess
import sys

EXTRAS = ("gymnasium", "minari", "PIL", "ray", "playwright", "datasets")
PACKAGES = ("storage", "client", "service", "codec", "system", "cli", "torchrl")


def test_every_package_imports_without_the_optional_extras() -> None:
    code = (
        "import importlib, sys\n"
        f"for name in {EXTRAS!r}:\n"
        "    sys.modules[name] = None  # importing it raises ImportError\n"
        f"for pkg in {PACKAGES!r}:\n"
        "    importlib.import_module('tdreplay.' + pkg)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
