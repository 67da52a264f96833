"""One router per resource: health and metrics, tables, data (extend/sample/stream), persistence."""

from . import data, health, persistence, tables

__all__ = ["data", "health", "persistence", "tables"]
