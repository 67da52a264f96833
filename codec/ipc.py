"""Arrow IPC byte layouts: where each column of a stream lies, found once and reused.

An Arrow IPC stream of one record batch is three messages::

    schema message | record-batch message (metadata, then the columns' bytes) | end of stream

Each message opens with :data:`CONTINUATION` and the length of its
metadata; the end of stream is that token and a zero length (:data:`EOS`).
The format tdreplay sends has no nulls, no variable-size lists and no
compression, so batches with the same columns (names, dtypes, item shapes)
and the same row count differ only in the columns' bytes: the metadata, and
where each column lies, are the same every time. The two hot paths use that:

* out: :class:`SampleLayout` encodes a zero batch once and records every
  column's offset; a sample is then gathered straight into a copy of that
  template, which is the response body (no encoding step);
* in: :class:`LayoutDecoder` decodes the first body of a layout with the
  full codec (:mod:`tdreplay.codec.arrow`) and remembers its column offsets
  (:class:`BodyLayout`) under its metadata bytes; a later body with the same
  metadata bytes is sliced at those offsets, without parsing anything.

The decoder trusts nothing it has not checked. A layout is learnt only from
a canonical body the codec decoded (one record batch, every column a view
inside its body, then the end of stream and nothing else), and a body is only
sliced if its metadata bytes, its length and its end of stream are the
remembered ones: its columns can then only be where the remembered ones were,
and the codec's checks of those columns hold for it too. The checks are per
column, never per row; anything else goes to the codec, which decodes it or
says what is wrong.

    >>> import torch
    >>> from tdreplay.codec import encode
    >>> decoder = LayoutDecoder()
    >>> for start in (0, 10):
    ...     body = memoryview(bytearray(encode({"obs": torch.arange(start, start + 4.0)})))
    ...     columns, n = decoder.decode_columns(body)
    >>> columns, n, decoder.hits
    ({('obs',): tensor([10., 11., 12., 13.])}, 4, 1)
"""

from __future__ import annotations

import math
import struct
import threading
from collections import OrderedDict
from collections.abc import Mapping

import numpy as np
import pyarrow as pa
import torch
from tensordict import TensorDict, TensorDictBase

from .dtypes import NUMPY
from .format import SEP, Column, NestedKey
from .from_arrow import nest, read_one, to_leaves
from .to_arrow import stream, to_record_batch

#: the token that opens every message of an Arrow IPC stream
CONTINUATION = 0xFFFFFFFF
#: the Arrow IPC end-of-stream marker (continuation token, zero length)
EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"

#: the columns of a batch: ``{key: (item shape, dtype)}``
Schema = Mapping[NestedKey, tuple[list[int], torch.dtype]]
#: the bytes of one stream
Body = bytes | bytearray | memoryview
# how BodyLayout gets a column: a view on the body, unpacked bits, or no elements at all
_VIEW, _BITS, _EMPTY = range(3)


def _message_end(body: Body, pos: int) -> int | None:
    """Where the metadata of the message at ``pos`` ends; ``None`` if none starts there."""
    if len(body) < pos + 8:
        return None
    continuation, length = struct.unpack_from("<Ii", body, pos)
    if continuation != CONTINUATION or length <= 0:
        return None
    return pos + 8 + length


#: where the metadata of the message at a position ends (public name for the client)
message_end = _message_end


def metadata_len(body: Body) -> int | None:
    """Bytes before the first column: the schema message and the record batch's metadata.

    ``None`` when the body does not start with those two messages in the
    current IPC framing (the codec then decodes it, or says what is wrong).
    """
    schema_end = _message_end(body, 0)
    end = None if schema_end is None else _message_end(body, schema_end)
    return end if end is not None and end <= len(body) else None


# ------------------------------------------------------------------ out: samples
class SampleLayout:
    """Where every column of an ``n``-row batch sits in its Arrow IPC stream.

    Args:
        schema: the columns, ``{key: (item shape, dtype)}``.
        n: rows per batch.

    Attributes:
        template: the stream of a zero batch (schema, record batch, end of stream).
        header: the schema message alone, ``header_len`` bytes.
        columns: ``{key: Column}``: where each column's values lie in ``template``
            (a zero-size field: no bytes).
        nbytes: bytes of the whole stream; ``batch_len``: of the record-batch message.

    >>> layout = SampleLayout({("obs",): ([2], torch.float32)}, n=3)
    >>> body = layout.template.copy()
    >>> obs = layout.columns["obs",]
    >>> body[obs.offset : obs.offset + obs.nbytes] = torch.arange(6.0).numpy().view(np.uint8)
    >>> from tdreplay.codec import decode
    >>> decode(body)["obs"].tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """

    def __init__(self, schema: Schema, n: int) -> None:
        self.n = n
        zeros = {k: torch.zeros([n, *shape], dtype=dtype) for k, (shape, dtype) in schema.items()}
        self.template = np.frombuffer(stream(to_record_batch(zeros)), dtype=np.uint8).copy()
        header_len = _message_end(self.template.data, 0)
        if header_len is None or self.template[-len(EOS) :].tobytes() != EOS:
            raise AssertionError("unexpected Arrow IPC stream framing")
        self.header_len = header_len
        self.header = self.template[:header_len].tobytes()
        # read the template back zero-copy: its buffers' addresses give the column offsets
        back = pa.ipc.open_stream(pa.py_buffer(self.template)).read_next_batch()
        base = self.template.ctypes.data
        self.columns: dict[NestedKey, Column] = {}
        for i, field in enumerate(back.schema):
            key = tuple(field.name.split(SEP))
            shape, dtype = schema[key]
            if math.prod(shape) == 0:  # a zero-size field: no bytes, nothing to gather
                self.columns[key] = Column(key, header_len, 0, dtype, tuple(shape))
                continue
            values = back.column(i)
            while pa.types.is_fixed_size_list(values.type):
                values = values.values
            data = values.buffers()[1]
            offset = data.address - base
            if not 0 <= offset <= len(self.template) - data.size or offset % 8:
                raise AssertionError(f"column {field.name!r} is not where expected in the template")
            self.columns[key] = Column(key, offset, data.size, dtype, tuple(shape))
        self.nbytes = len(self.template)
        self.batch_len = self.nbytes - header_len - len(EOS)

    def tile(self, batch: TensorDictBase, m: int) -> memoryview:
        """``m`` record-batch messages of ``n`` rows each, from a batch of ``m * n`` rows.

        Every message is this layout's template with its column bytes
        replaced; each column is copied for all ``m`` messages at once through
        a strided view. Behind :attr:`header` and followed by :data:`EOS`,
        they are a stream of ``m`` batches.
        """
        length = self.batch_len
        out = np.empty(m * length, dtype=np.uint8)
        rows = out.reshape(m, length)
        rows[:] = self.template[self.header_len : self.header_len + length]
        for key, c in self.columns.items():
            if c.nbytes == 0:  # zero-size field (reshape(m, -1) of no elements is ambiguous)
                continue
            src = batch.get(key).reshape(m, -1)
            at = c.offset - self.header_len
            if c.dtype == torch.bool:
                raw = np.packbits(src.numpy(), axis=1, bitorder="little")
            else:
                raw = src.contiguous().view(torch.uint8).numpy()
            rows[:, at : at + raw.shape[1]] = raw
        return memoryview(out.data)


# ------------------------------------------------------------------ in: bodies
class BodyLayout:
    """Where each column of one body layout lies, learnt from a body the codec decoded.

    A layout is only learnt from a body the codec decoded, and only if that
    body is canonical: the schema message, one record-batch message whose
    body holds every column (each inside the body, big enough for its rows,
    aligned for its dtype, viewed by the codec rather than converted), then
    the end-of-stream marker and nothing else. A later body with the same
    metadata bytes and the same length then has its columns exactly where
    this one had them (:meth:`fits` also checks its end-of-stream marker).
    All checks are per column, never per row.
    """

    def __init__(self, n: int, total: int, columns: list[Column]) -> None:
        self.n = n
        self.total = total
        self.columns = columns
        # what slicing needs, computed once. Every bool column is unpacked in one call (the
        # packed bytes of all of them, side by side): (key, kind, start, stop, dtype, [n, *shape])
        # with start:stop in the body's bytes (_VIEW) or in those unpacked bits (_BITS).
        self._plan: list[tuple[NestedKey, int, int, int, torch.dtype, list[int]]] = []
        self._packed: list[tuple[int, int]] = []
        bit = 0
        for c in columns:
            numel, shape = n * math.prod(c.shape), [n, *c.shape]
            if numel == 0:
                self._plan.append((c.key, _EMPTY, 0, 0, c.dtype, shape))
            elif c.dtype == torch.bool:
                nbytes = (numel + 7) // 8
                self._packed.append((c.offset, c.offset + nbytes))
                self._plan.append((c.key, _BITS, bit, bit + numel, c.dtype, shape))
                bit += 8 * nbytes
            else:
                stop = c.offset + numel * c.dtype.itemsize
                self._plan.append((c.key, _VIEW, c.offset, stop, c.dtype, shape))

    @classmethod
    def learn(
        cls, body: Body, rb: pa.RecordBatch, leaves: Mapping[NestedKey, torch.Tensor]
    ) -> BodyLayout | None:
        """The layout of ``body``, which the codec read as ``rb`` and decoded to ``leaves``.

        ``None`` if the body is not canonical (see the class docstring): a
        column the codec had to convert, rather than view, is never sliced.
        """
        end = metadata_len(body)
        if end is None or bytes(body[-len(EOS) :]) != EOS:
            return None
        try:  # the codec read this body already: nothing here should fail
            messages = pa.ipc.MessageReader.open_stream(pa.py_buffer(body))
            messages.read_next_message()  # the schema
            batch = messages.read_next_message()
        except (pa.ArrowException, StopIteration):  # pragma: no cover
            return None
        if batch.type != "record batch" or end + batch.body.size + len(EOS) != len(body):
            return None  # something between the batch and the end of stream, or after it
        base = np.frombuffer(body, dtype=np.uint8).ctypes.data
        columns = []
        for i, field in enumerate(rb.schema):
            key = tuple(field.name.split(SEP))
            t = leaves[key]
            shape = list(t.shape[1:])
            numel = t.numel()
            if numel == 0:  # zero-size field: nothing to slice
                columns.append(Column(key, end, 0, t.dtype, tuple(shape)))
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
            columns.append(Column(key, offset, data.size, t.dtype, tuple(shape)))
        return cls(rb.num_rows, len(body), columns)

    def fits(self, body: memoryview) -> bool:
        """Whether ``body``, which has this layout's metadata bytes, may be sliced.

        It may if it has the same length, ends with the end of stream, and is
        writable (torch views need writable memory; a read-only body goes to
        the codec).
        """
        return len(body) == self.total and not body.readonly and body[-len(EOS) :] == EOS

    def decode_columns(self, body: memoryview) -> dict[NestedKey, torch.Tensor]:
        """The columns of ``body``, which :meth:`fits`: views on it (bool columns are unpacked)."""
        # numpy slices and one torch.from_numpy each: about half the cost of torch.frombuffer
        whole = np.frombuffer(body, dtype=np.uint8)
        if self._packed:
            packed = np.concatenate([whole[start:stop] for start, stop in self._packed])
            bits = np.unpackbits(packed, bitorder="little").view(np.bool_)
        out = {}
        for key, kind, start, stop, dtype, shape in self._plan:
            if kind == _VIEW:
                t = torch.from_numpy(whole[start:stop].view(NUMPY[dtype]).reshape(shape))
                out[key] = t.view(dtype) if dtype == torch.bfloat16 else t
            elif kind == _BITS:
                out[key] = torch.from_numpy(bits[start:stop].reshape(shape))
            else:
                out[key] = torch.empty(shape, dtype=dtype)
        return out


class LayoutDecoder:
    """Decodes Arrow IPC streams of one record batch, fast for layouts seen before.

    The first body of a layout goes to the codec and its :class:`BodyLayout`
    is remembered under its metadata bytes; later bodies that fit it are
    sliced (see the module docstring). Thread safe: the layouts sit behind
    a lock, held only to look one up or to store one.

    Args:
        max_layouts: layouts remembered (least recently used forgotten first).

    Attributes:
        hits: bodies sliced so far, rather than parsed.
    """

    def __init__(self, max_layouts: int = 64) -> None:
        self.max_layouts = max_layouts
        self._layouts: OrderedDict[bytes, BodyLayout | None] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def decode_columns(self, body: Body) -> tuple[dict[NestedKey, torch.Tensor], int]:
        """The columns of ``body`` as ``{nested key: tensor}``, in column order, and its row count.

        The tensors view ``body`` (bool columns excepted: Arrow packs them into
        bits), as :func:`tdreplay.codec.decode`'s do. A writable body of a
        layout seen before is sliced; any other body (a new layout, a
        read-only body, one that does not fit its layout) is decoded by the
        codec.

        Raises:
            CodecError: the body is not an Arrow IPC stream of one record batch,
                or a column cannot be decoded (see :func:`tdreplay.codec.decode`).
        """
        view = body if isinstance(body, memoryview) else memoryview(body)
        end = metadata_len(view)
        key = bytes(view[:end]) if end else None
        known, layout = False, None
        if key is not None:
            with self._lock:
                known = key in self._layouts
                if known:
                    self._layouts.move_to_end(key)
                    layout = self._layouts[key]
                    if layout is not None and layout.fits(view):
                        self.hits += 1
                    else:
                        layout = None
        if layout is not None:  # sliced outside the lock: other threads decode meanwhile
            return layout.decode_columns(view), layout.n
        rb = read_one(view)
        leaves = to_leaves(rb)
        if key is not None and not known:
            learnt = BodyLayout.learn(view, rb, leaves)
            with self._lock:
                self._layouts.setdefault(key, learnt)
                while len(self._layouts) > self.max_layouts:
                    self._layouts.popitem(last=False)
        return leaves, rb.num_rows

    def decode(self, body: Body) -> TensorDict:
        """A TensorDict of batch ``[rows]`` holding :meth:`decode_columns`'s tensors.

        Raises:
            CodecError: see :meth:`decode_columns`.
        """
        leaves, n = self.decode_columns(body)
        return nest(leaves, n)
