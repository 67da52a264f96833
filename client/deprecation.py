"""The deprecated ``close`` of async objects (now ``aclose``), kept for one release."""

from __future__ import annotations

import warnings

# Classes whose deprecated ``close`` has warned in this process: the warning is
# said once, not on every call of a loop that closes many objects.
_WARNED_CLOSE: set[str] = set()


def warn_close_deprecated(obj: object) -> None:
    """Warn, once per class and process, that ``await obj.close()`` is now ``obj.aclose()``."""
    name = type(obj).__name__
    if name in _WARNED_CLOSE:
        return
    _WARNED_CLOSE.add(name)
    warnings.warn(
        f"{name}.close() is deprecated and will be removed in the next release; "
        f"await {name}.aclose() instead",
        DeprecationWarning,
        stacklevel=3,
    )
