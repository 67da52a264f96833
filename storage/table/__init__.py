"""The replay table (see :class:`~.table.Table`): base state and waiting, inserts, draws."""

from .table import Table

__all__ = ["Table"]
