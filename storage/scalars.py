"""A table part's scalar state, declared once.

A table's state is what its parts' ``state_dict()`` give (see
:meth:`Table.state_dict <tdreplay.storage.table.base.TableBase.state_dict>`):
per-slot tensors and a few scalars. Checkpoints keep it as it is; a memmap
table keeps the same state crash-durable (:mod:`~tdreplay.storage.durable`),
its per-slot tensors as files and its scalars as one fixed binary record.
Each part names its scalars here, once, and both use the names:

* :attr:`Scalars.SCALARS`: the scalars the durable record keeps, each with
  its type (``int``: a signed 64-bit field, ``float``: a double);
* :attr:`Scalars.DERIVED`: the scalars it does not keep, because a reopened
  table works them out again (from its columns, or afresh);

and :meth:`Scalars.scalars` gives both, as ``state_dict()`` carries them. A
scalar a part adds to its ``state_dict()`` without declaring it is drift the
guard test (``tests/storage/test_state_scalars.py``) reports; one declared in
``SCALARS`` that the record has no field for is refused when a durable table
is made.

    >>> class Ring(Scalars):
    ...     SCALARS = {"cursor": int}
    ...     def __init__(self) -> None:
    ...         self.cursor = 3
    >>> Ring().scalars()
    {'cursor': 3}
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

#: the types a recorded scalar may have
Scalar = int | float


class Scalars:
    """A part of a table with scalar state (see the module docstring)."""

    #: the scalars the durable record keeps: attribute name -> ``int`` or ``float``
    SCALARS: ClassVar[Mapping[str, type[Scalar]]] = {}
    #: the scalars it does not keep: a reopened table derives them again
    DERIVED: ClassVar[tuple[str, ...]] = ()

    def scalars(self) -> dict[str, Scalar]:
        """The part's scalar state by name, :attr:`SCALARS` then :attr:`DERIVED`."""
        return {name: getattr(self, name) for name in (*self.SCALARS, *self.DERIVED)}
