"""Typed views of sampled batches: ``@tensorclass`` objects from TensorDicts.

:func:`from_fields` generates a tensorclass from a table's schema (as its
``info`` lists the fields): nested keys become nested tensorclasses, and the
sample's ``index`` and ``sample_info`` are optional fields, so the same class
builds the rows a collector sends and reads the batches a learner samples.
:func:`to_tensorclass` puts a sampled TensorDict into any tensorclass, the
caller's own included. It is a view: keys the class does not declare are left
out (a learner may declare only what it reads), fields the batch lacks are an
error unless the class gives them a default.

A field named like an attribute of TensorDict or of tensorclasses
(``shape``, ``keys``, ``get``...) shadows it (tensordict's ``shadow=True``:
``batch.shape`` is the field; ``batch.batch_size`` is the batch's shape) when
the class still works so; a name it cannot take (its constructor's
``batch_size``, ``device`` or ``self``, a method it calls on itself: ``to``,
``clone``...) is refused, naming the field: read such a table's batches as
TensorDicts.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> Step = from_fields("demo", {"obs": {"shape": [2], "dtype": "float32"},
    ...                             "next.reward": {"shape": [1], "dtype": "float32"}})
    >>> td = TensorDict({"obs": torch.zeros(3, 2), "next": {"reward": torch.ones(3, 1)}}, [3])
    >>> step = to_tensorclass(td, Step)
    >>> type(step).__name__, type(step.next).__name__, step.next.reward.shape
    ('Demo', 'DemoNext', torch.Size([3, 1]))
"""

from __future__ import annotations

import dataclasses
import functools
import keyword
import typing
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensorclass, tensorclass

#: keys a sampled batch carries besides the schema's fields
SAMPLE_KEYS = ("index", "sample_info")


def _camel(name: str) -> str:
    parts = [p for p in name.replace("-", "_").split("_") if p]
    return "".join(p[:1].upper() + p[1:] for p in parts) or "Item"


def _ident(name: str) -> str:
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"field segment {name!r} is not a Python identifier")
    return name


#: names a field takes only by shadowing an attribute (``self``: the constructor's own)
_ATTRIBUTES = frozenset(dir(TensorDict)) | {"self"}


@functools.cache
def _shadows_well(name: str) -> bool:
    """Whether a ``@tensorclass(shadow=True)`` with a field ``name`` still works: made
    from a batch, read, sliced, cloned, moved. Tried once per name (tensordict decides)."""
    try:
        cls = tensorclass(dataclasses.make_dataclass("Probe", [(name, torch.Tensor)]), shadow=True)
        obj = to_tensorclass(TensorDict({name: torch.arange(2)}, [2]), cls)
        part = obj[1:].clone().to("cpu")
        return type(part) is cls and bool(getattr(part, name).tolist() == [1])
    except Exception:  # whatever breaks in tensordict: the name is refused
        return False


def _build(
    cls_name: str, tree: Mapping[str, Any], optional: tuple[str, ...] = (), where: str = ""
) -> type:
    shadowed = [key for key in tree if key in _ATTRIBUTES]
    for key in shadowed:
        if not _shadows_well(key):
            path = (*where.split(".")[:-1], key)
            raise ValueError(
                f"field {where + key!r}: a tensorclass cannot have a field named {key!r} (it "
                f"needs that name itself); read this table's batches as TensorDicts: sample() "
                f"or loader() without as_cls, batch[{path if len(path) > 1 else key!r}]"
            )
    spec: list[Any] = []
    for key, sub in tree.items():
        nested = isinstance(sub, dict)
        ftype: Any = (
            _build(cls_name + _camel(key), sub, where=f"{where}{key}.") if nested else torch.Tensor
        )
        if key in optional:
            spec.append((_ident(key), ftype | None, dataclasses.field(default=None)))
        else:
            spec.append((_ident(key), ftype))
    spec.sort(key=lambda s: len(s) == 3)  # dataclass: defaults last
    cls = dataclasses.make_dataclass(cls_name, spec)
    cls.__module__ = __name__
    return tensorclass(cls, shadow=bool(shadowed))


def from_fields(table: str, fields: Mapping[str, Any]) -> type:
    """A ``@tensorclass`` for items of ``table``, whose ``fields`` are ``{dotted key: spec}``.

    The class is named after the table in CamelCase (``robot_arm`` ->
    ``RobotArm``; nested groups ``RobotArmNext``...) and has optional
    ``index`` (int64 ``[B]``) and ``sample_info`` fields for sampled batches.
    Generated classes cannot be pickled by reference (they are not module
    attributes); send their ``._tensordict`` across processes instead.

    Raises:
        ValueError: a field's name (a segment of it) is no Python identifier, or is
            one a tensorclass cannot take (see above); names the field.
    """
    tree: dict[str, Any] = {}
    for dotted in fields:
        node = tree
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = None
    name = _camel(table)
    tree["index"] = None
    tree["sample_info"] = {"priority": None, "weight": None, "times_sampled": None, "key": None}
    return _build(name, tree, optional=SAMPLE_KEYS)


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # annotations naming types not importable here
        return {f.name: f.type for f in dataclasses.fields(cls)}


def _inner(hint: Any) -> type | None:
    """The tensorclass inside ``hint`` (``X``, ``X | None``, ``Optional[X]``), if any."""
    if isinstance(hint, type) and is_tensorclass(hint):
        return hint
    for arg in typing.get_args(hint):
        if isinstance(arg, type) and is_tensorclass(arg):
            return arg
    return None


def check_tensorclass(cls: Any) -> type:
    """``cls``, if it is a ``@tensorclass`` class (what ``as_cls`` takes).

    Raises:
        TypeError: it is not; names ``as_cls``.
    """
    if not (isinstance(cls, type) and is_tensorclass(cls)):
        raise TypeError(f"as_cls must be a @tensorclass, got {cls!r}")
    return cls


def to_tensorclass(td: TensorDictBase, cls: type) -> Any:
    """``td`` as an instance of the tensorclass ``cls`` (nested tensorclasses filled in too).

    Raises:
        TypeError: ``cls`` is not a tensorclass.
        ValueError: ``td`` lacks a field ``cls`` needs (and has no default).
    """
    check_tensorclass(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    keys = set(td.keys())  # (``key in td`` is not a TensorDict operation)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in keys:
            no_default = (
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            )
            if no_default:
                raise ValueError(f"{cls.__name__}.{name}: the batch has no key {name!r}")
            continue
        value = td.get(name)
        inner = _inner(hints.get(name))
        if inner is not None and isinstance(value, TensorDictBase):
            value = to_tensorclass(value, inner)
        kwargs[name] = value
    return cls(**kwargs, batch_size=td.batch_size, device=td.device)
