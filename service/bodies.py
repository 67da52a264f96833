"""The hot path's memory on the way in: request bodies read into reused buffers and decoded fast.

* :func:`read_body` copies the body's chunks, as the HTTP server hands them
  over, into a reused buffer of its size class: no large allocation per
  request (8 MiB bodies otherwise flip between fresh ``mmap`` and heap
  allocations and between 0.8 and 2.9 GB/s).
* :class:`BodyDecoder` decodes an Arrow IPC body into a TensorDict of views on
  that buffer. A client sends the same layout again and again (same columns,
  same row count): the bytes before the first column, the schema message and
  the record batch's metadata, are then identical and say where every column
  lies. The first body of a layout is decoded by :func:`tdreplay.codec.decode`
  and its column offsets remembered under those bytes; the next ones are
  sliced at the same offsets, without parsing anything. Only a canonical
  body is remembered (one record batch, then the end-of-stream marker, every
  column inside the body), and a body is only sliced if its metadata bytes,
  its length and its end-of-stream marker are the remembered ones: then its
  columns can only be where the remembered ones were. These checks are per
  column, never per row; anything else goes to the codec.
"""

from __future__ import annotations

import struct
import sys
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import torch
from starlette.requests import ClientDisconnect, Request
from tensordict import TensorDictBase

from tdreplay.codec import arrow
from tdreplay.storage import InvalidRequest, NestedKey, tensordict_from_leaves

from .errors import PayloadTooLarge
from .wire import EOS, Pool


class BodyBuffer:
    """A reusable byte buffer for request bodies."""

    def __init__(self, nbytes: int) -> None:
        self.array = np.empty(nbytes, dtype=np.uint8)
        self._free_refs = sys.getrefcount(self.array)

    def is_free(self) -> bool:
        return sys.getrefcount(self.array) <= self._free_refs


MIN_BODY_CLASS = 1 << 16


def _size_class(n: int) -> int:
    return max(MIN_BODY_CLASS, 1 << (max(n, 1) - 1).bit_length())


class BodyBuffers:
    """Request-body buffers by power-of-two size class, shared by every table."""

    def __init__(self, *, per_class: int = 8) -> None:
        self.pool: Pool[int, BodyBuffer] = Pool(BodyBuffer.is_free, per_key=per_class, max_keys=64)

    def view(self, nbytes: int) -> memoryview:
        """A writable ``nbytes`` view of a free buffer; the buffer is free again once the view is gone.

        A new buffer is left uninitialized (``np.empty``): no page is touched
        before the body is copied in.
        """
        size = _size_class(nbytes)
        buf = self.pool.take(size)
        if buf is None:
            buf = BodyBuffer(size)
            self.pool.keep(size, buf)
        return memoryview(buf.array.data)[:nbytes]


async def read_body(request: Request, buffers: BodyBuffers, limit: int) -> memoryview:
    """The request body, read into a reused buffer.

    Raises:
        PayloadTooLarge: the body is (or announces itself as) over ``limit`` bytes.
        InvalidRequest: the Content-Length header is malformed, the body is
            shorter than it says, or the connection ended before the body did
            (the client left, or the server cut it off at one of its limits).
    """
    try:
        return await _read_body(request, buffers, limit)
    except ClientDisconnect:  # a 4xx nobody reads, rather than a traceback in the log
        raise InvalidRequest(
            "the connection closed before the body was complete", field="body"
        ) from None


async def _read_body(request: Request, buffers: BodyBuffers, limit: int) -> memoryview:
    header = request.headers.get("content-length")
    if header is None:  # chunked upload: size unknown up front
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise _too_large(total, limit)
            chunks.append(chunk)
        return memoryview(b"".join(chunks))
    try:
        length = int(header)
    except ValueError:
        raise InvalidRequest(
            f"malformed Content-Length {header!r}", field="Content-Length"
        ) from None
    if length > limit:
        raise _too_large(length, limit)
    view = buffers.view(length)
    pos = 0
    async for chunk in request.stream():
        end = pos + len(chunk)
        if end > length:  # the HTTP server frames bodies by Content-Length; be safe anyway
            raise InvalidRequest(f"body longer than its Content-Length {length}")
        view[pos:end] = chunk
        pos = end
    if pos != length:
        raise InvalidRequest(f"body of {pos} bytes, Content-Length said {length}")
    return view


def _too_large(got: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"body of {got} bytes exceeds the server's limit of {limit} bytes",
        field="body",
        expected=f"<= {limit} bytes",
        got=got,
    )


# ------------------------------------------------------------------ decoding
CONTINUATION = 0xFFFFFFFF


def metadata_len(body: memoryview) -> int | None:
    """Bytes before the first column: the schema message and the record batch's metadata.

    ``None`` when the body does not start with those two messages in the
    current IPC framing (the codec then decodes it, or says what is wrong).
    """
    pos = 0
    for _ in range(2):
        if len(body) < pos + 8:
            return None
        continuation, length = struct.unpack_from("<Ii", body, pos)
        if continuation != CONTINUATION or length <= 0:
            return None
        pos += 8 + length
    return pos if pos <= len(body) else None


class BodyLayout:
    """Where each column of one body layout lies: ``(key, offset, bytes, dtype, shape)``.

    A layout is only learnt from a body the codec decoded, and only if that
    body is canonical: the schema message, one record-batch message whose
    body holds every column (each inside the body, big enough for its rows),
    then the end-of-stream marker and nothing else. A later body with the
    same metadata bytes and the same length then has its columns exactly
    where this one had them; :meth:`BodyDecoder.decode` also checks its
    end-of-stream marker. All checks are per column, never per row.
    """

    def __init__(
        self, n: int, total: int, columns: list[tuple[NestedKey, int, int, torch.dtype, list[int]]]
    ) -> None:
        self.n = n
        self.total = total
        self.columns = columns

    @classmethod
    def learn(cls, body: memoryview, td: TensorDictBase) -> BodyLayout | None:
        """The layout of ``body`` given its codec decoding ``td``; ``None`` if it is not plain
        (a column that the codec had to convert, rather than view, is not sliced later)."""
        end = metadata_len(body)
        if end is None or bytes(body[-len(EOS) :]) != EOS:
            return None
        try:  # the codec read this body already: nothing here should fail
            messages = pa.ipc.MessageReader.open_stream(pa.py_buffer(body))
            messages.read_next_message()  # the schema
            batch = messages.read_next_message()
            rb = arrow.read_one(body)
        except (pa.ArrowException, arrow.CodecError, StopIteration):  # pragma: no cover
            return None
        if batch.type != "record batch" or end + batch.body.size + len(EOS) != len(body):
            return None  # something between the batch and the end of stream, or after it
        base = np.frombuffer(body, dtype=np.uint8).ctypes.data
        n = rb.num_rows
        columns = []
        for i, field in enumerate(rb.schema):
            key = tuple(field.name.split(arrow.SEP))
            t = td.get(key)
            shape = list(t.shape[1:])
            numel = t.numel()
            if numel == 0:  # zero-size field: nothing to slice
                columns.append((key, end, 0, t.dtype, shape))
                continue
            values = rb.column(i)
            while pa.types.is_fixed_size_list(values.type):
                if values.offset or values.null_count:
                    return None
                values = values.values
            if values.offset or values.null_count:
                return None
            data = values.buffers()[1]
            offset = data.address - base
            needed = (numel + 7) // 8 if t.dtype == torch.bool else numel * t.dtype.itemsize
            if not (end <= offset and offset + data.size <= len(body) - len(EOS)):
                return None  # not inside the record batch's body (a copy, not a view)
            if data.size < needed or offset % t.dtype.itemsize:
                return None
            if t.dtype != torch.bool and t.data_ptr() != data.address:
                return None  # converted, not viewed
            columns.append((key, offset, data.size, t.dtype, shape))
        return cls(n, len(body), columns)

    def decode(self, body: memoryview) -> TensorDictBase:
        n = self.n
        leaves = {}
        for key, offset, size, dtype, shape in self.columns:
            numel = n * int(np.prod(shape, dtype=np.int64))
            if numel == 0:
                flat = torch.empty(0, dtype=dtype)
            elif dtype == torch.bool:
                bits = np.frombuffer(body, dtype=np.uint8, count=size, offset=offset)
                flat = torch.from_numpy(
                    np.unpackbits(bits, count=numel, bitorder="little").view(np.bool_)
                )
            else:
                flat = torch.frombuffer(body, dtype=dtype, count=numel, offset=offset)
            leaves[key] = flat.reshape([n, *shape])
        return tensordict_from_leaves(leaves, n)


class BodyDecoder:
    """Decodes Arrow IPC request bodies, fast for layouts seen before (see the module docstring).

    Args:
        max_layouts: layouts remembered (least recently used forgotten first).
    """

    def __init__(self, max_layouts: int = 64) -> None:
        self.max_layouts = max_layouts
        self._layouts: OrderedDict[bytes, BodyLayout | None] = OrderedDict()
        self.hits = 0

    def decode(self, body: memoryview) -> TensorDictBase:
        """A TensorDict of views on ``body`` (bool columns excepted: Arrow packs them into bits).

        Raises:
            CodecError: the body is not an Arrow IPC stream of one record batch,
                or a column cannot be decoded (see :func:`tdreplay.codec.decode`).
        """
        end = metadata_len(body)
        key = bytes(body[:end]) if end else None
        if key is not None and key in self._layouts:
            layout = self._layouts[key]
            self._layouts.move_to_end(key)
            # a read-only body (a chunked upload) is left to the codec: torch views need writable memory
            if (
                layout is not None
                and len(body) == layout.total
                and not body.readonly
                and body[-len(EOS) :] == EOS
            ):
                self.hits += 1
                return layout.decode(body)
        td = arrow.decode(body)
        if key is not None and key not in self._layouts:
            self._layouts[key] = BodyLayout.learn(body, td) if td.batch_dims == 1 else None
            while len(self._layouts) > self.max_layouts:
                self._layouts.popitem(last=False)
        return td
