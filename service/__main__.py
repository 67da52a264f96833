"""``python -m tdreplay.service serve ...``: the same as the ``tdreplay`` command."""

from .cli import main

if __name__ == "__main__":
    main()
