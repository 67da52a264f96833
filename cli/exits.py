"""What every ``tdreplay`` command shares: its exit statuses (:class:`Exit`), the one-line
error (:class:`CommandError`) and the one mapping of failures to both (:func:`run_command`).

Exit status: 0 done; 1 the operation failed (the message says why: the
server's or the storage's error, or a check made here); 2 bad usage; 3 no server
answered at the URL; 4 the server refused the token; 130 interrupted.

An operation's error (:func:`failure`) names its class, and its HTTP status only where a
server answered with it: a file or an argument refused here, before any request, was not
a server's answer.

    >>> def refused() -> None:
    ...     raise CommandError("the server refused the token", Exit.UNAUTHORIZED)
    >>> try:  # "tdreplay info: the server refused the token" on stderr
    ...     run_command("info", refused)
    ... except SystemExit as stopped:
    ...     print(stopped.code)
    4
"""

from __future__ import annotations

import enum
import os
import sys
from collections.abc import Callable

from tdreplay.storage import TDReplayError


class Exit(enum.IntEnum):
    """The ``tdreplay`` command's exit status."""

    OK = 0
    FAILED = 1  # the server or the storage refused the operation; the message says why
    USAGE = 2  # argparse's own status for a bad command line
    UNREACHABLE = 3  # no server answered at the URL
    UNAUTHORIZED = 4  # the server refused the token (401) or the operation (403)
    INTERRUPTED = 130


class CommandError(Exception):
    """A failure to report as one line, ``tdreplay <command>: <message>``, without a traceback."""

    def __init__(self, message: str, code: Exit = Exit.FAILED) -> None:
        super().__init__(message)
        self.code = code


def run_command(command: str, call: Callable[[], None]) -> None:
    """Run a command's ``call`` and exit the way every ``tdreplay`` command does: a failure
    is one line on stderr (no traceback) and its :class:`Exit` status."""
    try:
        call()
    except CommandError as err:
        if err.code == Exit.FAILED:
            sys.exit(f"tdreplay {command}: {err}")  # printed to stderr, status 1
        print(f"tdreplay {command}: {err}", file=sys.stderr)
        sys.exit(int(err.code))
    except TDReplayError as err:  # a server's answer, or the same check made here
        sys.exit(f"tdreplay {command}: {failure(err)}")
    except BrokenPipeError:  # `tdreplay info t | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(Exit.OK))
    except OSError as err:  # a file of the command's: unreadable, unwritable, missing
        where = f" {str(err.filename)!r}" if err.filename else ""
        sys.exit(f"tdreplay {command}:{where} {err.strerror or err}")
    except KeyboardInterrupt:
        print(f"tdreplay {command}: interrupted", file=sys.stderr)
        sys.exit(int(Exit.INTERRUPTED))


def failure(err: TDReplayError) -> str:
    """An operation's error as a command prints it: its message and class, and the HTTP
    status only when a server answered with it (:attr:`~tdreplay.storage.TDReplayError.answered`),
    not when the check was made here and no request went out.

        >>> from tdreplay.codec.errors import InvalidRequest, from_body
        >>> failure(InvalidRequest("no such file 'x.parquet'"))
        "no such file 'x.parquet' (InvalidRequest)"
        >>> failure(from_body(400, {"type": "InvalidRequest", "detail": "bad batch_size"}))
        'bad batch_size (InvalidRequest, HTTP 400)'
    """
    answered = f", HTTP {err.status}" if err.answered else ""
    return f"{err} ({err.type}{answered})"
