"""The sample bodies and layouts a table keeps, by batch size: which are forgotten first."""

from __future__ import annotations

import asyncio

import torch

from tdreplay.service.wire import SampleBuffers

SCHEMA = {("obs",): ([4], torch.float32), ("action",): ([], torch.int64)}


def test_the_least_recently_used_batch_size_is_forgotten_first() -> None:
    """Every use of a size makes it the most recent: a sample's pooled body (``lease``) and a
    stream's run, which uses only the layout. The touch on a layout kept is what keeps a
    streamed size recent: without it, a stream's size would be forgotten before a size last
    used earlier and rebuilt on its next run."""

    async def main() -> None:
        buffers = SampleBuffers(SCHEMA, max_sizes=2)
        one = await buffers.layout(1)
        two = await buffers.layout(2)
        assert await buffers.layout(1) is one  # a stream's next run: size 1 is the most recent
        await buffers.layout(3)  # one size too many: size 2 is forgotten, not size 1
        assert await buffers.layout(1) is one
        assert await buffers.layout(2) is not two  # rebuilt; now 3 was the least recent
        assert set(buffers._layouts) == {1, 2}

        body = await buffers.lease(1)  # pooled, and size 1 the most recent
        del body
        await buffers.layout(3)  # size 2 goes
        assert set(buffers._layouts) == {1, 3}
        kept = await buffers.lease(1)  # the same body again (free): size 1 most recent
        del kept
        await buffers.layout(2)
        assert set(buffers._layouts) == {1, 2}

    asyncio.run(main())
