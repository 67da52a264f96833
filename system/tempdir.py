"""A writable temporary directory, settled before torch is imported.

torch asks Python for a temporary directory as it is imported (``dill``, which it loads,
and ``torch._dynamo``, which tensordict loads, call ``tempfile.gettempdir()`` at import),
and Python raises ``FileNotFoundError`` when none of its candidates is writable:
``$TMPDIR``, ``/tmp``, ``/var/tmp``, ``/usr/tmp``, the working directory. That is the case
in a container with a read-only root filesystem (``docker run --read-only``, Kubernetes'
``readOnlyRootFilesystem``) and no tmpfs on ``/tmp``: the server ended at start in a
25-line traceback out of torch.

:func:`settle` runs first in the entry points (``tdreplay``, ``python -m tdreplay.service``):
where Python has a temporary directory, nothing changes; where it has none, the data root
named by ``TDREPLAY_ROOT`` (the image sets it: ``/data``, a volume) gets a private
``.tmp`` folder, which ``TMPDIR`` then names for this process and its children. Where that
is not possible either, :class:`NoTempDir` says what to mount, in one line.

    >>> settle() == tempfile.gettempdir()  # a usable one: left as it is
    True
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: the data root's temporary folder, where no other is writable (``<root>/.tmp``)
ROOT_TMP = ".tmp"


class NoTempDir(OSError):
    """No temporary directory is writable, and none could be made under the data root."""


def settle(env: Mapping[str, str] | None = None) -> str:
    """A writable temporary directory for this process: Python's, else ``<root>/.tmp``
    (``root`` from ``TDREPLAY_ROOT`` in ``env``, default ``os.environ``), which ``TMPDIR``
    and ``tempfile.tempdir`` then name. Returns it.

    Raises:
        NoTempDir: neither is writable (the message names what to mount or set).
    """
    env = os.environ if env is None else env
    try:
        return tempfile.gettempdir()
    except FileNotFoundError as err:
        tried = str(err).partition(" in ")[2] or "TMPDIR, /tmp, /var/tmp, /usr/tmp"
    root = env.get("TDREPLAY_ROOT")
    why = "TDREPLAY_ROOT is not set"
    if root:
        folder = Path(root).absolute() / ROOT_TMP
        given = os.environ.get("TMPDIR")
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.environ["TMPDIR"] = str(folder)
            return tempfile.gettempdir()  # asked again: $TMPDIR first
        except OSError as err:
            why = f"the data root's {folder} is not writable either ({err.strerror or err})"
            if given is None:
                os.environ.pop("TMPDIR", None)
            else:
                os.environ["TMPDIR"] = given
    raise NoTempDir(
        f"no writable temporary directory, which torch needs as it is imported: none of "
        f"{tried} is, and {why}. Mount one on /tmp (docker run --tmpfs /tmp; Kubernetes: an "
        "emptyDir), or set TMPDIR to a writable folder, or TDREPLAY_ROOT to the data root "
        f"(its {ROOT_TMP} folder is used)"
    )
