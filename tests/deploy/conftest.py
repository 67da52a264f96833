"""The Docker engine and the image, shared by the tests marked ``docker`` (once per session).

Those tests run only when asked for (``-m docker``, as ``make test-deploy`` does): they need
a Docker engine and minutes, so ``make test`` leaves them out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from dockerkit import (
    PREFIX,
    build_image,
    ensure_base_image,
    remove_images,
    start_engine,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "docker: builds and runs the image against a real Docker engine (make test-deploy)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "docker" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="needs a Docker engine: make test-deploy (pytest -m docker)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A Docker engine that answers: the running one, or dockerd started (and stopped) here."""
    daemon = start_engine(tmp_path_factory.mktemp("dockerd") / "dockerd.log")
    try:
        yield
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=60)


@pytest.fixture(scope="session")
def image(engine: None) -> Iterator[str]:
    """The server image, built once per session by ``make image`` on the debootstrap base."""
    ensure_base_image()
    tag = f"{PREFIX}:image"
    try:
        build_image(tag)
        yield tag
    finally:
        remove_images(tag, f"{tag}-build")


@pytest.fixture(scope="session")
def secrets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("secrets")
