"""tdreplay.service: the HTTP server (FastAPI on uvicorn) in front of tdreplay tables.

    $ tdreplay serve --schema schemas/ --root ./data --port 8000

or, in Python::

    >>> from tdreplay.service import Settings, create_app
    >>> app = create_app(Settings(schema_path="schemas/cartpole.yaml"))

or served until interrupted, what stops it raised (:func:`tdreplay.service.runner.run`).

The routes, media types and error statuses are those of
:mod:`tdreplay.codec.protocol`.
"""

from tdreplay.system.tempdir import settle

settle()  # before torch, which asks for a temporary directory as it is imported

from .app import create_app  # noqa: E402
from .settings import Settings  # noqa: E402

__all__ = ["Settings", "create_app"]
