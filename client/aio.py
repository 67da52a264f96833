"""``AsyncReplayClient``: the asyncio twin of :class:`~tdreplay.client.ReplayClient`.

    >>> async with AsyncReplayClient("http://replay:8000") as client:  # doctest: +SKIP
    ...     await client.extend("cartpole", rollout)
    ...     batch = await client.sample("cartpole", 256)

Same calls, same plans (:mod:`~tdreplay.client.core`), same errors; only the
I/O differs. The transport is HTTP/1.1 on asyncio streams with a pool of
keep-alive connections, written here (about a hundred lines) rather than
taken from httpx: httpx is not a runtime dependency of tdreplay, and on
large bodies asyncio streams were measured faster than ``httpx.AsyncClient``
(see ``bench/client_bench.py``). Connections belong to the event loop that
opened them; a client used from a new loop opens new ones.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from . import errors
from .commands import Request, Response
from .core import Call, Gather, Plan, Settings
from .loader import Loader, LoaderIterator
from .schema import load_spec
from .sync import ReplayClient, _Base, _restore
from .transport import Endpoint, head_lines
from .writer import AsyncWriter

T = TypeVar("T")

_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
_LIMIT = 1 << 20  # stream buffer: large enough that big bodies arrive in few wakeups


class AsyncTransport:
    """Executes :class:`Request` objects against one server from asyncio.

    Args: as :class:`~tdreplay.client.transport.Transport`.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_idle: int = 16,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._idle: list[_Conn] = []
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _new(self) -> _Conn:
        e = self.endpoint
        try:
            return await asyncio.wait_for(
                asyncio.open_connection(e.host, e.port, ssl=e.tls or None, limit=_LIMIT),
                self.connect_timeout,
            )
        except TimeoutError:
            raise errors.Timeout(
                f"connecting to {e.url} took over {self.connect_timeout}s", url=e.url
            ) from None
        except OSError as err:
            raise errors.ConnectionFailed(
                f"cannot connect to {e.url}: {err}", url=e.url, sent=False
            ) from None

    async def _take(self) -> tuple[_Conn, bool]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections of another (maybe closed) loop are useless here
            self._idle, self._loop = [], loop
        while self._idle:
            conn = self._idle.pop()
            if not conn[0].at_eof() and not conn[1].is_closing():
                return conn, True
            conn[1].close()
        return await self._new(), False

    def _give(self, conn: _Conn) -> None:
        if len(self._idle) < self.max_idle:
            self._idle.append(conn)
        else:
            conn[1].close()

    async def close(self) -> None:
        idle, self._idle = self._idle, []
        for _, w in idle:
            w.close()

    async def execute(self, req: Request) -> Response:
        """Send ``req`` and read the whole answer (see :meth:`Transport.execute`)."""
        conn, reused = await self._take()
        try:
            return await self._roundtrip(conn, req)
        except errors.ConnectionFailed:
            if not reused:
                raise
        return await self._roundtrip(await self._new(), req)

    async def _roundtrip(self, conn: _Conn, req: Request) -> Response:
        reader, writer = conn
        url, what = self.endpoint.url, f"{req.method} {req.target}"
        head = f"{req.method} {self.endpoint.prefix}{req.target} HTTP/1.1\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in head_lines(req, self.endpoint, self.token)
        )
        sent = False
        limit = self.timeout + req.wait
        try:
            writer.write(head.encode("latin-1") + b"\r\n")
            if req.body is not None and len(req.body):
                writer.write(req.body)
            sent = True
            await asyncio.wait_for(writer.drain(), limit)
            status, headers, body, keep = await asyncio.wait_for(_read_response(reader, req), limit)
        except TimeoutError:
            writer.close()
            raise errors.Timeout(
                f"{what}: no answer from {url} within {limit:g}s", url=url
            ) from None
        except (asyncio.IncompleteReadError, ConnectionError) as err:
            writer.close()
            raise errors.ConnectionFailed(
                f"{what}: connection to {url} lost: {err!r}", url=url, sent=sent
            ) from None
        except (ValueError, asyncio.LimitOverrunError) as err:
            writer.close()
            raise errors.ProtocolError(f"{what}: bad answer from {url}: {err}", url=url) from None
        except OSError as err:
            writer.close()
            raise errors.ConnectionFailed(f"{what}: {url}: {err!r}", url=url, sent=sent) from None
        except BaseException:
            writer.close()
            raise
        if keep:
            self._give(conn)
        else:
            writer.close()
        return Response(status, headers, body)


async def _read_response(
    reader: asyncio.StreamReader, req: Request
) -> tuple[int, dict[str, str], memoryview, bool]:
    """Parse one HTTP/1.1 response: ``(status, headers, body, keep_alive)``."""
    while True:
        raw = await reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise ValueError(f"bad status line {lines[0]!r}")
        status = int(parts[1])
        if status >= 200 or status == 101:
            break  # 1xx informational answers are skipped
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    keep = headers.get("connection", "").lower() != "close" and parts[0] != "HTTP/1.0"
    if status in (204, 304) or req.method == "HEAD":
        return status, headers, memoryview(b""), keep
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                    pass
                break
            chunks.append(await reader.readexactly(size + 2))
        return status, headers, memoryview(b"".join(c[:-2] for c in chunks)), keep
    if "content-length" in headers:
        n = int(headers["content-length"])
        data = await reader.readexactly(n) if n else b""
        if status < 300 and n:
            view = req.alloc(n)
            view[:] = data
            return status, headers, view, keep
        return status, headers, memoryview(data), keep
    return status, headers, memoryview(await reader.read()), False


class AsyncReplayClient(_Base):
    """The asyncio twin of :class:`~tdreplay.client.ReplayClient`: the same calls, awaited.

    Args: as :class:`~tdreplay.client.ReplayClient`. Pickles as its settings.
    """

    def _setup(self, settings: Settings) -> None:
        super()._setup(settings)
        self._transports = [
            AsyncTransport(
                u,
                token=settings.token,
                timeout=settings.timeout,
                connect_timeout=settings.connect_timeout,
                max_idle=settings.max_connections,
            )
            for u in settings.urls
        ]

    async def _run(self, plan: Plan[T]) -> T:
        result: Any = None
        exc: BaseException | None = None
        while True:
            try:
                step = plan.send(result) if exc is None else plan.throw(exc)
            except StopIteration as stop:
                return stop.value
            result, exc = None, None
            try:
                if isinstance(step, Call):
                    result = await self._call(step)
                else:
                    result = await self._gather(step)
            except errors.ReplayError as err:
                exc = err

    async def _call(self, call: Call) -> Any:
        policy, command = self.settings.retry, call.command
        start, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            req = command.request()
            try:
                response = await self._transports[call.shard].execute(req)
            except errors.TransportError as err:
                elapsed = time.monotonic() - start
                if not policy.should_retry(err, attempt, elapsed, idempotent=req.idempotent):
                    raise
                await asyncio.sleep(policy.delay(attempt))
                continue
            return command.parse(response)

    async def _gather(self, gather: Gather) -> list[Any]:
        return list(await asyncio.gather(*(self._call(c) for c in gather.calls)))

    async def close(self) -> None:
        """Close idle connections; the client stays usable."""
        for t in self._transports:
            await t.close()

    async def __aenter__(self) -> AsyncReplayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---------------------------------------------------------------- control
    async def health(self) -> dict[str, Any]:
        return await self._run(self._calls.health())

    async def tables(self) -> list[dict[str, Any]]:
        return await self._run(self._calls.tables())

    async def create_table(self, spec: dict[str, Any] | str | Path) -> dict[str, Any]:
        return await self._run(self._calls.create_table(load_spec(spec)))

    async def delete_table(self, table: str) -> None:
        await self._run(self._calls.delete_table(table))

    async def info(self, table: str) -> dict[str, Any]:
        return await self._run(self._calls.info(table))

    # ---------------------------------------------------------------- data
    async def extend(self, table: str, data: Any, *, timeout: float | None = None) -> torch.Tensor:
        """See :meth:`ReplayClient.extend`."""
        return await self._run(self._calls.extend(table, data, timeout))

    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        as_cls: type | None = None,
    ) -> Any:
        """See :meth:`ReplayClient.sample`."""
        return await self._run(self._calls.sample(table, batch_size, timeout, as_cls))

    async def update_priority(self, table: str, index: Any, priority: Any) -> None:
        await self._run(self._calls.update_priority(table, index, priority))

    async def checkpoint(self, table: str, path: str) -> str | list[str]:
        return await self._run(self._calls.checkpoint(table, path))

    async def restore(self, table: str, path: str) -> dict[str, Any]:
        return await self._run(self._calls.restore(table, path))

    async def export(
        self,
        table: str,
        format: str = "parquet",
        *,
        path: str | None = None,
        dest: str | Path | None = None,
    ) -> Any:
        """See :meth:`ReplayClient.export`."""
        result = await self._run(self._calls.export(table, format, path))
        if path is None and dest is not None:
            if not isinstance(result, bytes):
                raise ValueError("dest= takes one server's export; pass path= when sharded")
            Path(dest).write_bytes(result)
            return Path(dest)
        return result

    # ---------------------------------------------------------------- views and helpers
    async def tensorclass(self, table: str) -> type:
        """See :meth:`ReplayClient.tensorclass`."""
        if table not in self._classes:
            return self._tensorclass(table, await self.info(table))
        return self._classes[table]

    def loader(
        self,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 4,
        device: str | torch.device | None = None,
        as_cls: type | None = None,
        num_batches: int | None = None,
        timeout: float | None = None,
        keep: bool = False,
    ) -> AsyncLoader:
        """``async for batch in client.loader(...)``: the :class:`Loader`, awaited.

        The fetchers are the sync loader's threads (its buffer pool and CUDA
        staging too); the event loop only awaits the hand-over of each batch.
        """
        sync = _restore(ReplayClient, self.settings)
        assert isinstance(sync, ReplayClient)
        return AsyncLoader(
            Loader(
                sync,
                table,
                batch_size,
                prefetch=prefetch,
                device=device,
                as_cls=as_cls,
                num_batches=num_batches,
                timeout=timeout,
                keep=keep,
            )
        )

    def writer(
        self,
        table: str,
        chunk: int = 256,
        *,
        max_delay: float | None = 1.0,
        episode_key: str | None = None,
        end_key: str | None = None,
        timeout: float | None = None,
    ) -> AsyncWriter:
        """``async with client.writer(table) as w: await w.append(step)`` (see :class:`Writer`)."""
        return AsyncWriter(
            self,
            table,
            chunk,
            max_delay=max_delay,
            episode_key=episode_key,
            end_key=end_key,
            timeout=timeout,
        )


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
        it = iter(self.loader)
        try:
            while True:
                batch = await asyncio.to_thread(_next, it)
                if batch is _DONE:
                    return
                yield batch
        finally:
            it.close()


__all__ = ["AsyncLoader", "AsyncReplayClient", "AsyncTransport"]
