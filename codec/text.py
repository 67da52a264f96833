"""Text as it crosses a door: what the other side sent, made safe to show, and why a JSON text
failed to decode, in one wording for every door. The errors (:mod:`.errors`) quote both."""

from __future__ import annotations

import unicodedata


def json_failure(err: Exception) -> str:
    """Why a JSON text failed to decode, in words: one wording for every door (the HTTP
    routes' JSON bodies, the shared-memory socket's control frames).

        >>> import json
        >>> try:
        ...     json.loads("[" * 100_000)
        ... except RecursionError as err:
        ...     json_failure(err)
        'nested too deeply (arrays or objects inside one another past the depth the decoder allows)'
    """
    if isinstance(err, RecursionError):
        return "nested too deeply (arrays or objects inside one another past the depth the decoder allows)"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 ({err.reason} at byte {err.start})"
    return str(err)[:200]  # a JSONDecodeError's position, a huge integer's digit limit


#: Unicode categories a terminal or a log does not show as themselves: control characters
#: (Cc: a newline, an escape) and format characters (Cf: a bidi override such as U+202E, which
#: reorders what follows it; a zero-width space or joiner, which hides)
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf"})
#: what :func:`printable` escapes: those, and lone surrogates (Cs: a ``str`` may hold one,
#: e.g. from JSON's ``"\ud800"``, but no UTF-8 does: writing one to a terminal, a log or a
#: file fails with ``UnicodeEncodeError``)
ESCAPED_CATEGORIES = HIDDEN_CATEGORIES | {"Cs"}


def is_hidden(char: str) -> bool:
    """Whether ``char`` is a control or format character (:data:`HIDDEN_CATEGORIES`)."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def printable(text: str) -> str:
    r"""``text`` with each control or format character, and each lone surrogate, written as
    its escape (``\x1b``, ``\n``, ``\u202e``, ``\ud800``): what a server sent, safe to show on
    a terminal or in a log (an escape sequence there could retitle the window, recolour or
    erase lines, or forge a line; a bidi override could make ``gnp.exe`` read ``exe.png``; a
    lone surrogate fails to encode). Letters outside ASCII stay as they are.

        >>> printable("no table \x1b]0;owned\x07 'x'")
        "no table \\x1b]0;owned\\x07 'x'"
        >>> printable("café \u202egnp.exe")
        'café \\u202egnp.exe'
        >>> printable("a\ud800b")
        'a\\ud800b'
    """
    if text.isprintable():
        return text
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) in ESCAPED_CATEGORIES else c for c in text
    )
