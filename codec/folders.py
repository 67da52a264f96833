"""Folders made for what an operation writes, removed again if it fails.

A Minari export makes its datasets root (and any missing parent) before it writes;
one that fails must leave none of them behind, and never touch a folder that was
there before it began.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def made_for(folder: str | Path) -> Iterator[Path]:
    """Make ``folder`` and its missing parents; if the block fails (or is abandoned), remove
    again those made here, deepest first, each only while it is empty: a folder that existed
    before is never touched, and one that another writer filled meanwhile is kept.

        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as top:
        ...     try:
        ...         with made_for(Path(top) / "a" / "b") as folder:
        ...             (folder / "half-written").touch()
        ...             (folder / "half-written").unlink()  # the block's own cleanup
        ...             raise OSError("disk full")
        ...     except OSError:
        ...         pass
        ...     os.listdir(top)
        []
    """
    folder = Path(folder)
    made = [d for d in (folder, *folder.parents) if not os.path.lexists(d)]
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for d in made:
            with contextlib.suppress(OSError):  # not empty: someone else's now
                d.rmdir()
        raise
