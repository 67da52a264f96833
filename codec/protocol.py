"""The client/server contract in one place: routes, media types, headers, errors.

Bulk data travels as Arrow IPC streams (:mod:`tdreplay.codec.arrow`); control
messages and errors as JSON. An error body is
``{"type": <error class>, "detail": <message>, "field": <key or null>, ...}``
and ``type`` names one of :data:`ERROR_STATUS`'s classes, which the client
raises under the same name.
"""

from __future__ import annotations

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON = "application/json"

API = "/v1"
TABLES = f"{API}/tables"


def table_path(name: str, action: str = "") -> str:
    """``/v1/tables/{name}`` or ``/v1/tables/{name}/{action}``."""
    return f"{TABLES}/{name}" + (f"/{action}" if action else "")


#: header carrying a client-chosen id that makes an extend idempotent
REQUEST_ID = "X-Request-Id"
#: response header: the rows an extend wrote (comma-free count)
ROWS_WRITTEN = "X-Rows-Written"

#: error ``type`` -> HTTP status; the service answers with these, the client maps back
ERROR_STATUS: dict[str, int] = {
    "SchemaError": 422,
    "InvalidRequest": 400,
    "CodecError": 400,
    "TableNotFound": 404,
    "TableExists": 409,
    "RateLimitTimeout": 429,
    "EmptyTableError": 409,
    "CheckpointError": 500,
    "BackendError": 503,
    "Unauthorized": 401,
    "Forbidden": 403,
    "PayloadTooLarge": 413,
    "UnsupportedMediaType": 415,
    "InternalError": 500,
}
