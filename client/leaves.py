"""A step's leaves, read and checked as fast as Python allows: the per-step half of the
writer's column buffer (:mod:`.columns`), which copies them into its rows.

Walking a TensorDict's leaves the generic way (``items(include_nested=True,
leaves_only=True)``) costs about as much as copying them; a step with the key tree
of the first one is read against that tree instead (:func:`gather`), a plain
``TensorDict`` straight from its key dicts (:func:`gather_dicts`), and its leaves
are checked against the layout in C (:func:`layout_guard`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tensordict import TensorDict, TensorDictBase

_TensorGuards: Any  # torch.compile's tensor check, in C (Any: its stub misstates the sizes)
try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover - a torch without it: the Python check alone
    _TensorGuards = None

#: a leaf key as ``TensorDictBase.items(True, True)`` yields it: a name, or a tuple of names
Key = str | tuple[str, ...]


def leaves_of(td: TensorDictBase) -> tuple[tuple[Key, ...], tuple[Any, ...]]:
    pairs = tuple(td.items(include_nested=True, leaves_only=True))
    if not pairs:
        return (), ()
    keys, values = zip(*pairs, strict=True)
    return keys, values


def dotted(key: Key) -> str:
    return key if isinstance(key, str) else ".".join(key)


#: the key tree of a step: the names at one level, for each the tree below it (``None``: a
#: leaf), and the positions of those that are not leaves with their trees (empty: the level
#: holds leaves only)
Tree = tuple[tuple[str, ...], tuple["Tree | None", ...], tuple[tuple[int, "Tree"], ...]]


def step_tree(keys: tuple[Key, ...]) -> Tree:
    """The key tree of leaf keys as ``items(True, True)`` yields them (depth first, in order)."""
    names: list[str] = []
    below: dict[str, list[Key]] = {}
    for key in keys:
        path = (key,) if isinstance(key, str) else key
        if path[0] not in below:
            names.append(path[0])
            below[path[0]] = []
        if len(path) > 1:
            below[path[0]].append(path[1:] if len(path) > 2 else path[1])
    subs = tuple(step_tree(tuple(below[n])) if below[n] else None for n in names)
    return tuple(names), subs, tuple((i, sub) for i, sub in enumerate(subs) if sub is not None)


def gather(td: TensorDictBase, tree: Tree, out: list[Any]) -> bool:
    """Append the leaves of ``td`` to ``out`` in ``tree``'s order; False if its keys differ.

    Four times cheaper than ``td.items(True, True)``, which is generic
    (leaf predicates, key tuples); per step, that difference is most of the cost.
    A step with more (a non-tensor entry, which the wire format leaves out too)
    is False here and goes the slow way.
    """
    names, subs, _ = tree
    i = 0
    for name, value in td.items():
        if i == len(names) or name != names[i]:
            return False
        sub = subs[i]
        i += 1
        if sub is None:
            out.append(value)
        elif not isinstance(value, TensorDictBase) or not gather(value, sub, out):
            return False
    return i == len(names)


def gather_dicts(entries: dict[str, Any], tree: Tree, out: list[Any]) -> bool:
    """:func:`gather` for a plain ``TensorDict``, read from its key dicts (``_tensordict``).

    A plain TensorDict keeps its entries, nested TensorDicts included, in one
    dict per level, in ``items()`` order: a level with the same names in the
    same order is one tuple comparison, and its values are the leaves: the
    runs of leaves between nested entries are copied to ``out`` as slices
    (a Python loop over every entry cost a fifth more). Three times cheaper
    again than :func:`gather`; any other kind of nested entry is False here
    (the general way handles it).
    """
    names, _, nested = tree
    if tuple(entries) != names:
        return False
    if not nested:
        out.extend(entries.values())
        return True
    values = list(entries.values())
    at = 0
    for i, sub in nested:
        out.extend(values[at:i])
        value = values[i]
        if type(value) is not TensorDict or not gather_dicts(value._tensordict, sub, out):
            return False
        at = i + 1
    out.extend(values[at:])
    return True


def layout_guard(values: list[Any]) -> Callable[..., bool] | None:
    """A check in C that tensors, passed in order, are like ``values``, or ``None`` (no such check).

    ``check(*leaves)`` is True only if each leaf is a tensor of its value's
    dtype, shape, device, ``requires_grad`` and dispatch keys, under the
    dispatch state (inference mode, autocast) the check was made in; strides
    and offsets are not checked (the copy takes any). For a cartpole step (11
    leaves) it costs 0.6 us where reading the dtypes and shapes in Python
    costs 1.4 us. False is no refusal, only "not known alike": a step in
    another mode, or one that requires grad where these did not, is then
    checked the Python way.
    """
    if _TensorGuards is None:  # pragma: no cover
        return None
    try:
        guard = _TensorGuards(
            *values,
            dynamic_dims_sizes=[list(v.shape) for v in values],
            dynamic_dims_strides=[[None] * v.dim() for v in values],  # not checked
        )
    except Exception:  # pragma: no cover - another torch's signature: the Python check alone
        return None
    return guard.check if guard.check(*values) else None
