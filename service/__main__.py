"""``python -m tdreplay.service serve ...``: run the server (``tdreplay serve``; the
other ``tdreplay`` commands are :mod:`tdreplay.cli`'s)."""

from .cli import main

if __name__ == "__main__":
    main()
