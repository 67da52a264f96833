"""``python -m tdreplay.cli ...``: the same as the ``tdreplay`` command."""

from . import main

if __name__ == "__main__":
    main()
