"""A request id (``X-Request-Id``): what makes an extend or an insert idempotent, and its one
rule for every door.

Over HTTP it travels as a header; over the shared-memory socket, in a binary frame's field
(:func:`tdreplay.codec.shm.extend_frame`) written in :data:`REQUEST_ID_ENCODING`, as HTTP
writes a header. The rule (:data:`RequestId`, part of the contract's parameter models) is
what HTTP carries as it is, so an id means the same through either door: the client checks
it before sending over either, the server whichever door it came through, and a refusal is
the same :class:`~tdreplay.codec.errors.InvalidRequest` naming ``X-Request-Id`` and the limit.

    >>> from tdreplay.codec.params import ExtendParams, parse
    >>> parse(ExtendParams, {REQUEST_ID: "retry-é"}).request_id
    'retry-é'
    >>> parse(ExtendParams, {REQUEST_ID: "id-€"})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: X-Request-Id: a request id is at most 200 characters an HTTP header carries as they are (latin-1, no control character, no space or tab at either end); 'id-€' holds '€' at 3
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from .errors import InvalidRequest
from .protocol import REQUEST_ID

#: longest request id, in characters (one byte each in :data:`REQUEST_ID_ENCODING`)
MAX_REQUEST_ID = 200
#: how a request id is written as bytes: an HTTP header's value, and a binary frame's field
REQUEST_ID_ENCODING = "latin-1"
#: what a request id may hold: an HTTP field value as RFC 9110 has it (visible latin-1
#: characters, spaces and tabs between them), which HTTP carries as it is: a control character
#: does not pass HTTP, and a space or tab at either end arrives stripped (another id than the
#: one the other door carries: a retry there would insert again)
_CARRIED = re.compile(r"[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?")
#: a character no request id holds, wherever it stands
_NEVER = re.compile(r"[^\t\x20-\x7e\x80-\xff]")


def _carried(value: str | None) -> str | None:
    if value and not _CARRIED.fullmatch(value):
        bad = _NEVER.search(value)
        why = f"{bad.group()!r} at {bad.start()}" if bad else "a space or tab at an end"
        raise InvalidRequest(
            f"{REQUEST_ID}: a request id is at most {MAX_REQUEST_ID} characters an HTTP header "
            "carries as they are (latin-1, no control character, no space or tab at either "
            f"end); {value[:60]!r} holds {why}",
            field=REQUEST_ID,
            expected=f"at most {MAX_REQUEST_ID} latin-1 characters, no control character",
            got=value[:60],
        )
    return value


#: a request id as the contract's models take it (``None`` or ``""``: none)
RequestId = Annotated[str | None, AfterValidator(_carried)]
