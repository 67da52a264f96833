"""``async for batch in client.loader(...)``: a :class:`~tdreplay.client.loader.Loader`, awaited.

The fetchers are the blocking loader's threads; the event loop only awaits
each hand-over (and the start of a pass, which may ask the table's ``info``),
in a worker thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from .loader import Loader, LoaderIterator

_DONE = object()


def _next(it: LoaderIterator) -> Any:
    try:
        return next(it)
    except StopIteration:
        return _DONE


class AsyncLoader:
    """An async iterator over a :class:`Loader`'s batches."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    async def __aiter__(self) -> AsyncIterator[Any]:
        it = await asyncio.to_thread(iter, self.loader)  # a pass may ask the table's info
        try:
            while True:
                batch = await asyncio.to_thread(_next, it)
                if batch is _DONE:
                    return
                yield batch
        finally:
            it.close()
