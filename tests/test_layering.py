"""Dependencies point one way: service -> storage -> codec; torchrl -> client -> codec;
cli -> service and client; service and client -> system.

Each check imports one package in a fresh interpreter and looks at what else
got loaded, so a stray import anywhere in the package fails it. The layers
are :data:`test_import_cycles.LAYERS`, which also checks them statically, on
every import statement (function-level and ``TYPE_CHECKING`` ones too).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from test_import_cycles import FOLDERS, LAYERS

# Third-party packages a layer must not load: the web stack belongs to the service.
WEB_STACK = {
    "system": ["fastapi", "uvicorn", "starlette", "httpx", "torch"],
    "codec": ["fastapi", "uvicorn"],
    "storage": ["fastapi", "uvicorn", "starlette", "httpx"],
    "service": [],
    "client": ["fastapi", "uvicorn", "starlette"],
    "torchrl": ["fastapi", "uvicorn", "starlette"],
    "cli": [],
}


def loaded_after(module: str) -> set[str]:
    code = f"import sys, json; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        (
            f"tdreplay.{layer}",
            [f"tdreplay.{p}" for p in LAYERS if p != layer and p not in below] + WEB_STACK[layer],
        )
        for layer, below in LAYERS.items()
    ],
)
def test_import_direction(module: str, forbidden: list[str]) -> None:
    mods = loaded_after(module)
    assert module in mods
    leaked = sorted(m for m in mods for f in forbidden if m == f or m.startswith(f + "."))
    assert not leaked, f"importing {module} pulled in {leaked}"


def test_no_top_level_folder_modules() -> None:
    """The folders map into the tdreplay namespace; nothing installs `storage`, `service` or `client`."""
    code = (
        "import importlib.util as u, os, sys; os.chdir('/'); sys.path = [p for p in sys.path if p not in ('', '.')]; "
        "print([m for m in ('storage', 'service', 'client', 'codec', 'system') "
        "if u.find_spec(m) is not None])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_every_subpackage_is_packaged() -> None:
    """pyproject lists packages explicitly (the folders are mapped); a new subfolder must be listed."""
    repo = Path(__file__).resolve().parent.parent
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = set()
    for top in ("storage", "service", "client", "codec", "system", "cli", "torchrl"):
        folder = repo / FOLDERS.get(top, top)
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join(("tdreplay", top, *rel)))
    assert found - listed == set(), f"add to [tool.setuptools] packages: {sorted(found - listed)}"
