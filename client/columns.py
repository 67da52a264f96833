"""The writer's step storage: one preallocated tensor per column, steps copied in row by row.

A collector appends steps one at a time; stacking them as TensorDicts costs
far more than the copy itself (an ``unsqueeze`` per step, a ``cat`` per
chunk). Here the first step fixes the layout — its leaf keys, shapes and
dtypes — and every step after it is copied straight into the next row of
each column (one fused copy of all its leaves), after a check that it has
the same keys, shapes and dtypes (made in C where torch has the means,
:func:`~.leaves.layout_guard`). Chunks are slices of the columns.

Per step, walking a TensorDict's leaves the generic way
(``items(include_nested=True, leaves_only=True)``) costs about as much as
the copy; a plain ``TensorDict`` step of the first step's key tree is read
straight from its key dicts instead (:func:`~.leaves.gather_dicts`), and anything
else (another TensorDict class, a tensorclass, a differing step) goes the
general way, which also names what differs.

A writer that sends in the background lends the columns a chunk views
(:meth:`ColumnBuffer.lend`) and appends into a second set meanwhile; the
lent set comes back (:meth:`ColumnBuffer.reclaim`) once the chunk is sent.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> cols = ColumnBuffer(4)
    >>> for t in range(3):
    ...     _ = cols.append(TensorDict({"obs": torch.full((2,), t), "done": torch.tensor([t == 2])}, []))
    >>> chunk = cols.front(2, copy=True)  # the first two rows leave the buffer
    >>> chunk["obs"].tolist(), cols.n
    ([[0, 0], [1, 1]], 1)
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensorclass

from .batches import as_batch
from .leaves import Key, Tree, dotted, gather, gather_dicts, layout_guard, leaves_of, step_tree

_DTYPE, _SHAPE = attrgetter("dtype"), attrgetter("shape")
#: times a layout's C check (:func:`~.leaves.layout_guard`) is made again for steps it does not
#: know (another mode, ``requires_grad``) before the Python check alone is used
_GUARDS = 4
_InferenceMode, _foreach_copy_ = torch._C._InferenceMode, torch._foreach_copy_


def _allocating() -> torch.inference_mode:
    """The mode the columns are allocated in: out of inference mode, whatever the caller's. A first
    step appended under ``torch.inference_mode()`` would make them inference tensors, and
    every later in-place copy outside it (rows extended, rows moved) would fail."""
    return torch.inference_mode(False)


#: a set of columns lent out (:meth:`ColumnBuffer.lend`): the columns and their row views
Lent = tuple[list[torch.Tensor], list[list[torch.Tensor] | None]]


def unusable(key: Key, v: Any) -> Exception | None:
    """The error for a leaf no column can take a copy of (``None``: it can): not a tensor, a
    meta tensor (no data) or a sparse one (a column is dense)."""
    if not isinstance(v, torch.Tensor):
        return TypeError(f"step key {dotted(key)!r} holds {type(v).__name__}, not a tensor")
    if v.is_meta:
        return TypeError(f"step key {dotted(key)!r} holds a meta tensor, which has no data to copy")
    if v.layout is not torch.strided:
        return TypeError(
            f"step key {dotted(key)!r} holds a {v.layout} tensor; steps hold dense tensors "
            "(call .to_dense())"
        )
    return None


class ColumnBuffer:
    """Rows of steps, one tensor per leaf key, allocated once and grown only when needed.

    Live rows are ``[start, start + n)`` of each column; sending the front
    rows advances ``start``, and the rows left are moved to the front when the
    next append needs the room (so chunks handed out as views stay valid until
    the next :meth:`append`, or, once the columns are lent, until they are
    reclaimed).

    Args:
        rows: rows to allocate at first (the chunk size).
    """

    def __init__(self, rows: int) -> None:
        self.rows = max(1, rows)
        self.keys: tuple[Key, ...] | None = None  # as the first step's items() yields them
        self._tree: Tree | None = None
        self._guard: Callable[..., bool] | None = None  # the layout checked in C, once known
        self._guards = _GUARDS
        self.start = 0
        self.n = 0
        self._shapes: list[torch.Size] = []
        self._dtypes: list[torch.dtype] = []
        self._cols: list[torch.Tensor] = []
        self._capacity = 0
        self._row_views: list[list[torch.Tensor] | None] = []
        self._numpy: dict[Key, Any] = {}
        self._spare: Lent | None = None  # a second set of columns, for lend()

    @property
    def capacity(self) -> int:
        return self._capacity

    # ---------------------------------------------------------------- layout
    def _layout(self, keys: tuple[Key, ...], values: tuple[Any, ...], rows: bool) -> None:
        if not keys:
            raise ValueError("a step must hold at least one tensor")
        for key, v in zip(keys, values, strict=True):
            if (err := unusable(key, v)) is not None:
                raise err
        self.keys = keys
        self._tree = step_tree(keys)
        self._shapes = [v.shape[1:] if rows else v.shape for v in values]
        self._dtypes = [v.dtype for v in values]

    def _mismatch(self, keys: tuple[Key, ...], values: tuple[Any, ...], rows: bool) -> Exception:
        """The error for a step whose keys, shapes or dtypes differ from the first step's."""
        assert self.keys is not None
        want = {dotted(k) for k in self.keys}
        got = {dotted(k) for k in keys}
        if want - got:
            return KeyError(f"step lacks key(s) {sorted(want - got)} that the first step had")
        if got - want:
            return KeyError(f"step has key(s) {sorted(got - want)} that the first step had not")
        index = {dotted(k): i for i, k in enumerate(self.keys)}
        for key, v in zip(keys, values, strict=True):
            i = index[dotted(key)]
            if not isinstance(v, torch.Tensor):
                return TypeError(f"step key {dotted(key)!r} holds {type(v).__name__}, not a tensor")
            shape = v.shape[1:] if rows else v.shape
            if shape != self._shapes[i]:
                return ValueError(
                    f"step key {dotted(key)!r} has shape {list(shape)}, "
                    f"the first step's was {list(self._shapes[i])}"
                )
            if v.dtype != self._dtypes[i]:
                return TypeError(
                    f"step key {dotted(key)!r} has dtype {v.dtype}, the first step's was {self._dtypes[i]}"
                )
        return ValueError("step does not match the first step's layout")  # pragma: no cover

    def _ordered(
        self, keys: tuple[Key, ...], values: tuple[Any, ...], rows: bool
    ) -> tuple[Any, ...]:
        """``values`` in the layout's column order, checked against it."""
        if keys != self.keys:
            if self.keys is None or sorted(map(dotted, keys)) != sorted(map(dotted, self.keys)):
                raise self._mismatch(keys, values, rows)
            by_key = dict(zip(map(dotted, keys), values, strict=True))
            values = tuple(by_key[dotted(k)] for k in self.keys)
            keys = self.keys
        if not self._same(values, rows=rows):
            raise self._mismatch(keys, values, rows)
        return values

    def _same(self, values: Any, *, rows: bool = False) -> bool:
        """Whether ``values`` (in column order) are tensors of the layout's shapes and dtypes.

        The per-step check where the C one (:func:`~.leaves.layout_guard`) is
        missing or does not know the step: ``map`` with an ``attrgetter`` reads
        the attributes in C, half the cost of a comprehension.
        """
        try:
            if list(map(_DTYPE, values)) != self._dtypes:
                return False
            if rows:
                return [v.shape[1:] for v in values] == self._shapes
            return list(map(_SHAPE, values)) == self._shapes
        except AttributeError:  # a leaf that is not a tensor
            return False

    # ---------------------------------------------------------------- storage
    def _allocate(self, rows: int) -> None:
        old, live = self._cols, self.n
        with _allocating():  # never inference tensors
            self._cols = [
                torch.empty((rows, *shape), dtype=dtype)
                for shape, dtype in zip(self._shapes, self._dtypes, strict=True)
            ]
        if old and live:
            for new, col in zip(self._cols, old, strict=True):
                new[:live].copy_(col[self.start : self.start + live])
        self.start = 0
        self._capacity = rows
        self._row_views = [None] * rows
        self._numpy = {}
        self._spare = None  # the old size

    def _reserve(self, k: int) -> None:
        """Room for ``k`` more rows after the live ones."""
        if self.start + self.n + k <= self._capacity:
            return
        if self.n + k <= self._capacity:  # move the live rows to the front
            src = slice(self.start, self.start + self.n)
            for col in self._cols:
                rows = col[src]
                col[: self.n].copy_(rows.clone() if self.start < self.n else rows)
            self.start = 0
            return
        self._allocate(max(self.rows, 2 * self._capacity, self.n + k))

    def _put(self, values: Any) -> None:
        """Copy one step's leaves (checked, in column order) into the next row."""
        pos = self.start + self.n
        if pos >= self._capacity:
            self._reserve(1)
            pos = self.start + self.n
        views = self._row_views[pos]
        if views is None:
            views = self._row_views[pos] = [col[pos] for col in self._cols]
        # one fused copy of all the leaves (a Python loop of copy_ costs 4x more), in
        # inference mode: a step that requires grad must not tie the buffer to its graph,
        # and the copy skips autograd's dispatch (a sixth cheaper than with grad off)
        mode = _InferenceMode(True)
        try:
            _foreach_copy_(views, values)
        except Exception:
            self._refuse(values)  # a leaf that cannot be copied: the error names its key
            raise
        finally:
            del mode
        self.n += 1

    def _refuse(self, values: Any) -> None:
        """Raise the error naming a leaf of ``values`` (in column order) that cannot be
        copied (:func:`unusable`), if one is why a copy failed."""
        assert self.keys is not None
        for key, v in zip(self.keys, values, strict=True):
            if (err := unusable(key, v)) is not None:
                raise err from None

    def append(self, data: Any) -> int:
        """Copy a step (batch ``[]``) or rows (batch ``[k]``, a tensorclass, a mapping) in.

        Returns:
            The rows added.

        Raises:
            KeyError: the step lacks a key of the first step, or has one more.
            ValueError, TypeError: a leaf's shape or dtype differs from the first step's.
        """
        tree = self._tree
        if tree is not None and type(data) is TensorDict and not data.batch_size:
            # the per-step fast path: a plain TensorDict shaped like the first step
            values: list[Any] = []
            if gather_dicts(data._tensordict, tree, values) and (
                ((guard := self._guard) is not None and guard(*values)) or self._known(values)
            ):
                self._put(values)
                return 1
        return self._append_any(data)

    def _known(self, values: list[Any]) -> bool:
        """:meth:`_same` for a step the C check does not know; one that passes is what
        the C check is made for then (a few times, see ``_GUARDS``)."""
        if not self._same(values):
            return False
        self._guard = layout_guard(values) if self._guards else None
        self._guards = max(0, self._guards - 1)
        return True

    def _append_any(self, data: Any) -> int:
        """:meth:`append` the general way: any step or rows, checked, with errors naming what
        differs. A first step refused leaves no layout: the next one sets it."""
        if self.keys is not None:
            return self._append_checked(data)
        try:
            return self._append_checked(data)
        except BaseException:
            self._unset()
            raise

    def _unset(self) -> None:
        """Forget the layout (a first step refused): as made."""
        self.keys, self._tree, self._shapes, self._dtypes = None, None, [], []
        self._guard, self._guards = None, _GUARDS
        self._cols, self._row_views, self._numpy, self._spare = [], [], {}, None
        self.start = self.n = self._capacity = 0

    def _append_checked(self, data: Any) -> int:
        if is_tensorclass(data):
            data = data._tensordict  # type: ignore[union-attr]
        if isinstance(data, TensorDictBase) and data.batch_dims == 0:
            values: Any = []
            if self._tree is None or not gather(data, self._tree, values) or not self._same(values):
                keys, values = leaves_of(data)  # the first step, or one that differs: the slow way
                if self.keys is None:
                    self._layout(keys, values, rows=False)
                values = self._ordered(keys, values, rows=False)
            self._put(values)
            return 1
        td = as_batch(data)
        k = td.batch_size[0]
        if k == 0:
            return 0
        keys, values = leaves_of(td)
        if self.keys is None:
            self._layout(keys, values, rows=True)
        values = self._ordered(keys, values, rows=True)
        self._reserve(k)
        pos = self.start + self.n
        try:
            with torch.no_grad():
                for col, v in zip(self._cols, values, strict=True):
                    col[pos : pos + k].copy_(v)
        except Exception:
            self._refuse(values)
            raise
        self.n += k
        return k

    def column(self, key: Key) -> Any:
        """Live rows ``[n, -1]`` of column ``key``: numpy where it can, else torch (read only)."""
        assert self.keys is not None
        view = self._numpy.get(key)
        if view is None:
            i = [dotted(k) for k in self.keys].index(dotted(key))
            flat = self._cols[i].reshape(self._capacity, -1)
            try:
                view = flat.numpy()
            except TypeError:  # a dtype numpy lacks (bfloat16): stay in torch
                view = flat
            self._numpy[key] = view
        return view[self.start : self.start + self.n]

    def front(self, m: int, *, copy: bool) -> TensorDict:
        """The first ``m`` live rows as a TensorDict (views unless ``copy``); they leave the buffer.

        Views stay valid until the next :meth:`append` (which may move rows),
        or, after :meth:`lend`, until the lent columns are reclaimed.
        """
        assert self.keys is not None and 0 < m <= self.n
        rows = slice(self.start, self.start + m)
        out = TensorDict(batch_size=[m])
        for key, col in zip(self.keys, self._cols, strict=True):
            part = col[rows]
            out.set(key, part.clone() if copy else part)
        self.start += m
        self.n -= m
        if not self.n:
            self.clear()
        return out

    # ---------------------------------------------------------------- lending
    def lend(self) -> Lent | None:
        """Set the columns aside for the views :meth:`front` handed out; append into a second set.

        The live rows (an unfinished episode) move to the second set (the
        spare a :meth:`reclaim` gave back, or a new one), so the lent views
        stay as they are while they are sent. Nothing changes for the caller
        but where the rows are.

        Returns:
            The lent set, for :meth:`reclaim` (``None``: no columns yet).
        """
        if not self._cols:
            return None
        lent: Lent = (self._cols, self._row_views)
        if self._spare is not None:
            cols, views = self._spare
        else:
            with _allocating():  # never inference tensors
                cols = [torch.empty_like(c) for c in self._cols]
            views = [None] * self._capacity
        self._spare = None
        if self.n:
            with torch.no_grad():
                for new, col in zip(cols, self._cols, strict=True):
                    new[: self.n].copy_(col[self.start : self.start + self.n])
        self._cols, self._row_views, self._numpy, self.start = cols, views, {}, 0
        return lent

    def reclaim(self, lent: Lent | None) -> None:
        """Take back a set :meth:`lend` gave out (nothing views it any more) as the spare."""
        if lent is None or not self._cols:
            return
        cols = lent[0]
        if len(cols) == len(self._cols) and all(
            c.shape == o.shape and c.dtype == o.dtype for c, o in zip(cols, self._cols, strict=True)
        ):
            self._spare = lent  # else the buffer grew meanwhile: let it go

    def clear(self) -> None:
        """Forget the live rows; a buffer grown far past its first size is given back."""
        self.start = self.n = 0
        if self._capacity > 4 * self.rows:
            self._cols, self._row_views, self._numpy, self._spare = [], [], {}, None
            self._capacity = 0
