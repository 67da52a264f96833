"""Checks of what callers hand a table: extend rows and ``sample(out=...)`` buffers (slots:
:func:`tdreplay.codec.indices.slot_tensor`, the rule of every door).

Every check runs before the table changes anything, so a rejected call
writes no row and moves no counter. Errors name the key, what was expected
and what came.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensorclass

from tdreplay.codec.protocol import MAX_WEIGHT
from tdreplay.codec.spaces import outside_categories

from .errors import InvalidRequest, SchemaError
from .spec import NestedKey, join_key
from .tensordicts import byte_view, leaves, plain_leaves

INFO_KEYS: list[NestedKey] = [
    ("index",),
    ("sample_info", "priority"),
    ("sample_info", "weight"),
    ("sample_info", "times_sampled"),
    ("sample_info", "key"),
]
INFO_DTYPES = {
    ("index",): torch.int64,
    ("sample_info", "priority"): torch.float32,
    ("sample_info", "weight"): torch.float32,
    ("sample_info", "times_sampled"): torch.int64,
    ("sample_info", "key"): torch.int64,
}
#: the sample-info columns of a table whose sampler weighs its items (prioritized): those
#: of every sample, and ``max_weight``, what each ``weight`` was divided by
WEIGHTED_INFO_DTYPES = {**INFO_DTYPES, MAX_WEIGHT: torch.float64}


def info_dtypes(weighted: bool) -> dict[NestedKey, torch.dtype]:
    """The sample-info columns of a table whose sampler weighs items, or does not."""
    return WEIGHTED_INFO_DTYPES if weighted else INFO_DTYPES


@dataclass(frozen=True)
class SampleTarget:
    """Buffers to sample into, checked once (``Table.target``) and then used again and again.

    A server gathering into the same pooled body or shared-memory slot for
    every request would otherwise check the same TensorDict every time.

    Attributes:
        out: the TensorDict (or tensorclass) a sample fills and returns.
        rows: the batch size it is for.
        bufs: its tensors of the table's fields, by key.
        info: its sample-info tensors, by key (those it has).
        weighted: whether the table's samples carry ``max_weight`` too (:func:`info_dtypes`).
    """

    out: Any
    rows: int
    bufs: dict[NestedKey, torch.Tensor]
    info: dict[NestedKey, torch.Tensor]
    weighted: bool = False

    @functools.cached_property
    def words(self) -> Words | None:
        """The sample-info buffers as memoryviews, for a small sample written item by item
        (a torch call costs more than the values); ``None`` when the target lacks one of
        them. Each was checked to be one a sample writes in place (``RowChecker.out_buffers``)."""
        if not all(k in self.info for k in info_dtypes(self.weighted)):
            return None
        index, priority, weight, times, key = (self.info[k].numpy().data for k in INFO_KEYS)
        scale = self.info[MAX_WEIGHT].numpy().data if self.weighted else None
        return Words(index, priority, weight, times, key, scale)

    @functools.cached_property
    def row_bytes(self) -> dict[NestedKey, memoryview]:
        """The field buffers' bytes, for a small sample copied row by row
        (``Backend.gather_rows``)."""
        return {k: byte_view(t) for k, t in self.bufs.items()}


@dataclass(frozen=True, slots=True)
class Words:
    """A target's sample-info buffers as memoryviews (:attr:`SampleTarget.words`), in the
    order of :data:`INFO_KEYS`."""

    index: memoryview
    priority: memoryview
    weight: memoryview
    times: memoryview
    key: memoryview
    max_weight: memoryview | None = None  # a weighted table's

    def put_weights(
        self,
        priority: torch.Tensor | None,
        weight: torch.Tensor | None,
        max_weight: torch.Tensor | None = None,
    ) -> None:
        """A small sample's priorities, weights (and a weighted table's ``max_weight``),
        item by item; 1 for each where a sampler has none (``None``)."""
        views = [(self.priority, priority), (self.weight, weight)]
        if self.max_weight is not None:
            views.append((self.max_weight, max_weight))
        for view, values in views:
            ones: list[float] = [1.0] * len(view)
            for j, v in enumerate(ones if values is None else values.tolist()):
                view[j] = v  # type: ignore[call-overload]  # a float view (typeshed: int only)


class RowChecker:
    """Validates input against one table's schema.

    Args:
        name: the table, for messages.
        schema: ``{nested key: (shape, dtype)}`` (``TableSpec.torch_schema()``).
        capacity: the table's capacity (an extend may not exceed it).
        categories: the integer fields that declare ``n`` categories, ``{key: n}``
            (``TableSpec.categories()``): their values must lie in ``0 .. n-1``.
        info: the sample-info columns of the table's samples (:func:`info_dtypes`).
    """

    def __init__(
        self,
        name: str,
        schema: dict[NestedKey, tuple[list[int], torch.dtype]],
        capacity: int,
        categories: Mapping[NestedKey, int] | None = None,
        info: Mapping[NestedKey, torch.dtype] = INFO_DTYPES,
    ) -> None:
        self.name = name
        self.info = dict(info)
        self._schema = schema
        self._keys = list(schema)
        self.capacity = capacity
        self._categories = dict(categories or {})

    def rows(self, td: Any) -> tuple[dict[NestedKey, torch.Tensor], int]:
        """Check ``td`` (an extend's rows) against the schema.

        Returns:
            Its leaves (CPU, contiguous) by nested key, and its row count.

        Raises:
            SchemaError: not a TensorDict of batch ``[N]``, or a key missing,
                extra, or of the wrong dtype or shape.
            InvalidRequest: ``N`` is 0 or above capacity, or a field that declares ``n``
                categories holds a value outside ``0 .. n-1``.
        """
        if is_tensorclass(td):
            td = td._tensordict
        if isinstance(td, Mapping) and not isinstance(td, TensorDictBase):
            return self._columns(td)
        if not isinstance(td, TensorDictBase):
            raise SchemaError(
                f"table {self.name!r}: extend takes a TensorDict, got {type(td).__name__}",
                table=self.name,
                expected="TensorDict",
                got=type(td).__name__,
            )
        if td.batch_dims != 1:
            raise SchemaError(
                f"table {self.name!r}: extend needs batch dims [N], got batch_size {list(td.batch_size)}",
                table=self.name,
                field="batch_size",
                expected="[N]",
                got=list(td.batch_size),
            )
        got = plain_leaves(td)
        if got is None or len(got) != len(self._keys) or not all(k in got for k in self._keys):
            got = leaves(td)  # the general walk; it also orders the error reports
        return self._check(got, td.batch_size[0])

    def _columns(self, columns: Mapping[Any, Any]) -> tuple[dict[NestedKey, torch.Tensor], int]:
        """Flat columns ``{nested key: tensor [N, *shape]}``: ``N`` is the first column's rows."""
        got: dict[NestedKey, Any] = {}
        for key, value in columns.items():
            if not isinstance(key, tuple) or not all(isinstance(part, str) for part in key):
                raise SchemaError(
                    f"table {self.name!r}: extend takes a TensorDict, or flat columns keyed by "
                    f"tuples of strings; got a {type(columns).__name__} with key {key!r:.40}",
                    table=self.name,
                    expected="TensorDict",
                    got=type(columns).__name__,
                )
            got[key] = value
        first = next(iter(got.values()), None)
        if not isinstance(first, torch.Tensor) or first.ndim == 0:
            raise SchemaError(
                f"table {self.name!r}: extend needs columns of shape [N, *item shape]",
                table=self.name,
                field="batch_size",
                expected="[N]",
            )
        return self._check(got, first.shape[0])

    def _check(
        self, got: dict[NestedKey, Any], n: int
    ) -> tuple[dict[NestedKey, torch.Tensor], int]:
        if n == 0:
            raise InvalidRequest(
                f"table {self.name!r}: extend with no rows", table=self.name, field="batch_size"
            )
        if n > self.capacity:
            raise InvalidRequest(
                f"table {self.name!r}: extend of {n} rows exceeds capacity {self.capacity}",
                table=self.name,
                field="batch_size",
                expected=f"<= {self.capacity}",
                got=n,
            )
        missing = [k for k in self._keys if k not in got]
        if missing:
            raise SchemaError(
                f"table {self.name!r}: missing key {join_key(missing[0])!r}",
                table=self.name,
                field=join_key(missing[0]),
                expected="present",
                got="missing",
            )
        extra = [k for k in got if k not in self._schema]
        if extra:
            raise SchemaError(
                f"table {self.name!r}: unexpected key {join_key(extra[0])!r} (not in the schema)",
                table=self.name,
                field=join_key(extra[0]),
                expected="absent",
                got="present",
            )
        data: dict[NestedKey, torch.Tensor] = {}
        for key, (shape, dtype) in self._schema.items():
            value = got[key]
            name = join_key(key)
            if not isinstance(value, torch.Tensor):
                raise SchemaError(
                    f"table {self.name!r}: key {name!r} holds {type(value).__name__}, not a tensor",
                    table=self.name,
                    field=name,
                    expected="tensor",
                    got=type(value).__name__,
                )
            if value.dtype != dtype:
                raise SchemaError(
                    f"table {self.name!r}: key {name!r} has dtype {str(value.dtype).removeprefix('torch.')}, "
                    f"expected {str(dtype).removeprefix('torch.')}",
                    table=self.name,
                    field=name,
                    expected=dtype,
                    got=value.dtype,
                )
            if list(value.shape) != [n, *shape]:
                raise SchemaError(
                    f"table {self.name!r}: key {name!r} has shape {list(value.shape)}, expected {[n, *shape]}",
                    table=self.name,
                    field=name,
                    expected=[n, *shape],
                    got=list(value.shape),
                )
            if value.device.type != "cpu":
                value = value.cpu()
            data[key] = value.contiguous()
        for key, count in self._categories.items():
            self._check_category(key, data[key], count)
        return data, n

    def _check_category(self, key: NestedKey, value: torch.Tensor, n: int) -> None:
        """Every element of ``value`` one of a field's ``n`` categories, ``0 .. n-1``."""
        found = outside_categories(value.numpy(), n)
        if found is None:
            return
        _, bad = found
        name = join_key(key)
        raise InvalidRequest(
            f"table {self.name!r}: key {name!r} holds {bad}, outside its {n} categories "
            f"0 .. {n - 1}",
            table=self.name,
            field=name,
            expected=f"0 .. {n - 1}",
            got=bad,
        )

    def out_buffers(
        self, out: TensorDictBase, n: int
    ) -> tuple[dict[NestedKey, torch.Tensor], dict[NestedKey, torch.Tensor]]:
        """The schema's tensors in ``out``, and the sample-info tensors it already holds:
        each is written in place, so each must fit (:func:`_fits`).

        Raises:
            InvalidRequest: ``out``'s batch is not ``[n]``, a field is missing, or a field
                or a sample-info tensor is not a contiguous CPU tensor of its dtype and
                shape (``index`` and ``sample_info``: ``[n]``).
        """
        if is_tensorclass(out):
            out = out._tensordict
        if list(out.batch_size) != [n]:
            raise InvalidRequest(
                f"table {self.name!r}: out has batch_size {list(out.batch_size)}, expected [{n}]",
                table=self.name,
                field="out",
                expected=[n],
                got=list(out.batch_size),
            )
        # Fast path, e.g. a previous batch: a plain TensorDict holding every key
        # as a fitting tensor, read off its dicts. Anything else takes the
        # general path below, which also reports what does not fit.
        got = plain_leaves(out)
        if got is not None and all(k in got for k in self.info):
            fields = self._schema.items()
            if all(_fits(got.get(k), d, (n, *shape)) for k, (shape, d) in fields) and all(
                _fits(got[k], d, (n,)) for k, d in self.info.items()
            ):
                return {k: got[k] for k in self._schema}, {k: got[k] for k in self.info}
        bufs = {}
        for key, (shape, dtype) in self._schema.items():
            t = out.get(key, None)
            if not _fits(t, dtype, (n, *shape)):
                raise self._unfit(key, t, dtype, (n, *shape))
            bufs[key] = t
        out_info = {}
        for k, dtype in self.info.items():
            t = out.get(k, None)
            if isinstance(t, torch.Tensor):  # written in place: checked as the fields are
                if not _fits(t, dtype, (n,)):
                    raise self._unfit(k, t, dtype, (n,))
                out_info[k] = t
        return bufs, out_info

    def _unfit(
        self, key: NestedKey, t: Any, dtype: torch.dtype, shape: tuple[int, ...]
    ) -> InvalidRequest:
        """The error for an ``out`` buffer ``t`` that a sample cannot write into (:func:`_fits`)."""
        if isinstance(t, torch.Tensor):
            grad = ", requiring grad" if t.requires_grad else ""
            layout = "" if t.is_contiguous() else "non-contiguous "
            what = f"a {layout}{t.device.type} {t.dtype} tensor of shape {list(t.shape)}{grad}"
        else:
            what = "none" if t is None else type(t).__name__
        return InvalidRequest(
            f"table {self.name!r}: out[{join_key(key)!r}] must be a contiguous CPU {dtype} "
            f"tensor of shape {list(shape)} that does not require grad, got {what}",
            table=self.name,
            field=join_key(key),
            expected=f"{dtype} {list(shape)}",
            got=what,
        )


def _fits(t: Any, dtype: torch.dtype, shape: tuple[int, ...]) -> bool:
    """Whether a sample can write into ``t`` in place: a contiguous CPU tensor of ``dtype``
    and ``shape`` that does not require grad (a few items are written item by item
    through its memory, :attr:`SampleTarget.words`)."""
    return (
        isinstance(t, torch.Tensor)
        and t.dtype == dtype
        and t.shape == shape
        and t.is_contiguous()
        and t.device.type == "cpu"
        and not t.requires_grad
    )
