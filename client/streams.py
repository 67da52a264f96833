"""Sample streams: the record batches of a chunked Arrow IPC answer, one by one.

``POST /v1/tables/{name}/stream`` answers one Arrow IPC stream: the schema,
then record batches (several per HTTP chunk, or one split over chunks), then
the end-of-stream marker. Every batch of a stream has one row count and one
layout, so one byte length: it is learnt from the first batch (pyarrow reads
that message), and each batch is then cut from the received bytes and handed
on as a one-batch stream of its own (schema + batch + end of stream), which
the client's layout decoder slices at remembered offsets instead of parsing
(:class:`tdreplay.codec.ipc.LayoutDecoder`). Reading the answer through
``http.client`` and pyarrow's stream reader instead cost more than the
sample itself at batch 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa

from ..codec.ipc import EOS, message_end
from .http_values import Alloc, fresh


def one_batch_streams(chunks: Iterable[bytes], alloc: Alloc = fresh) -> Iterator[memoryview]:
    """Each record batch in the stream ``chunks`` carry, as a writable one-batch stream,
    each in memory ``alloc`` gives (the loader's pinned buffers, when batches go to CUDA).

    Raises:
        ValueError: the bytes are not an Arrow IPC stream (no schema first, or a batch
            pyarrow cannot read), or the stream ends before its end-of-stream marker.
    """
    buf = bytearray()
    header: bytes | None = None
    batch_len = 0
    for chunk in chunks:
        buf += chunk
        while True:
            if header is None:
                end = message_end(buf, 0)
                if end is None or end > len(buf):
                    if len(buf) >= 8 and end is None:
                        raise ValueError("the stream does not start with an Arrow IPC message")
                    break
                header = bytes(buf[:end])
                del buf[:end]
                continue
            if buf[:8] == EOS:
                return
            if not batch_len:
                batch_len = _message_length(buf)
                if not batch_len:
                    break  # not all of the first batch is here yet
            if len(buf) < batch_len:
                break
            one = alloc(len(header) + batch_len + len(EOS))
            one[: len(header)] = header
            one[len(header) : len(header) + batch_len] = buf[:batch_len]
            one[len(header) + batch_len :] = EOS
            del buf[:batch_len]
            yield one
    raise ValueError("the stream ended before its end-of-stream marker")


def _message_length(buf: bytearray) -> int:
    """Bytes of the whole IPC message at the start of ``buf`` (0: not all of it is there).

    Raises:
        ValueError: it is not a message pyarrow can read.
    """
    end = message_end(buf, 0)
    if end is None:
        if len(buf) >= 8:
            raise ValueError("expected an Arrow IPC message")
        return 0
    if end > len(buf):
        return 0
    reader = pa.BufferReader(pa.py_buffer(bytes(buf)))
    try:
        pa.ipc.read_message(reader)
    except pa.ArrowInvalid as err:  # the metadata is all here: it is not a message
        raise ValueError(f"not an Arrow IPC message: {err}") from None
    except OSError:  # its body is not all here yet ("expected to be able to read ...")
        return 0
    return int(reader.tell())
