"""tdreplay.schemas: the table schemas tdreplay ships (data files, installed with the wheel).

``cartpole``, ``atari`` and ``robot`` (YAML), and ``table.schema.json``, the JSON
Schema of the format (generated from :class:`tdreplay.storage.TableSpec`).
``tdreplay serve --schema cartpole`` and ``tdreplay create cartpole`` find
them by name.

    >>> from tdreplay import schemas
    >>> schemas.names()
    ['atari', 'cartpole', 'robot']
    >>> schemas.find("cartpole").name
    'cartpole.yaml'
"""

from __future__ import annotations

from pathlib import Path

#: the folder holding the shipped schema files
FOLDER = Path(__file__).resolve().parent

SUFFIXES = (".yaml", ".yml", ".json")


def names() -> list[str]:
    """The names of the shipped schemas (the JSON Schema of the format excluded)."""
    return sorted(
        p.stem
        for p in FOLDER.iterdir()
        if p.suffix in SUFFIXES and not p.name.endswith(".schema.json")
    )


def find(name: str) -> Path | None:
    """The shipped schema file called ``name`` (``"cartpole"`` or ``"cartpole.yaml"``), or ``None``."""
    stem = Path(name).stem if Path(name).suffix in SUFFIXES else Path(name).name
    for suffix in SUFFIXES:
        candidate = FOLDER / f"{stem}{suffix}"
        if candidate.is_file() and not candidate.name.endswith(".schema.json"):
            return candidate
    return None


def resolve(path: str | Path) -> Path:
    """``path`` itself when it exists, else the shipped schema or folder it names.

    A schema path that does not exist falls back to what tdreplay ships:
    ``cartpole``, ``cartpole.yaml`` or ``schemas/cartpole.yaml`` to the shipped
    cartpole schema, ``schemas`` or ``schemas/`` to the folder of them all. Any
    other missing path is returned as it is (its reader reports it).

        >>> resolve("no/such/schemas") == FOLDER, resolve("no/such/cartpole.yaml") == find("cartpole")
        (True, True)
        >>> resolve("no/such/thing.yaml").name
        'thing.yaml'
    """
    given = Path(path)
    if given.exists():
        return given
    if given.name == "schemas":
        return FOLDER
    return find(given.name) or given
