"""``python -m tdreplay.service serve ...``: ``tdreplay serve`` (:mod:`tdreplay.cli.serve`).

A program's entry, not part of the service: nothing imports it, and the command line it
runs sits above the service (tests/test_import_cycles.py exempts this module alone)."""

from tdreplay.cli.serve import main

if __name__ == "__main__":
    main()
