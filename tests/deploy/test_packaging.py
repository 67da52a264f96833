"""What an installed tdreplay carries: the shipped schemas in the wheel, /docs without a CDN."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import warnings
import zipfile
from pathlib import Path

from deploykit import REPO


def test_the_wheel_ships_the_schemas(tmp_path: Path) -> None:
    source = tmp_path / "src"  # a copy: the build leaves build/ beside what it builds
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for folder in {Path(d).parts[0] for d in dirs.values()}:
        shutil.copytree(
            REPO / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("tdreplay-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for schema in ("cartpole.yaml", "atari.yaml", "robot.yaml", "table.schema.json", "__init__.py"):
        assert f"tdreplay/schemas/{schema}" in names, sorted(n for n in names if "schemas" in n)


def test_docs_are_served_without_a_cdn(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Using `httpx`")
        from fastapi.testclient import TestClient

    from tdreplay.service import Settings, create_app

    with TestClient(create_app(Settings(root=tmp_path / "data", torch_threads=0))) as client:
        page = client.get("/docs")
        assert page.status_code == 200
        assert "cdn" not in page.text and "https://" not in page.text.split("</head>")[0]
        for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
            assert f"/docs/assets/{asset}" in page.text
            got = client.get(f"/docs/assets/{asset}")
            assert got.status_code == 200 and len(got.content) > 10_000
        assert client.get("/docs/assets/index.html").status_code == 404  # a fixed list only
        assert client.get("/docs/assets/..%2F..%2Fpyproject.toml").status_code == 404
