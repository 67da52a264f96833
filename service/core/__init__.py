"""The server's core: its tables and their operations, with no transport around them.

The HTTP routes (:mod:`tdreplay.service.routes`), the same-host socket and
in-process callers are doors onto one :class:`Core`: they parse a request
into a model of the contract (:mod:`tdreplay.codec.params`), call one operation, and encode its answer.
Every rule - validation, limits, the rate-limiter wait, idempotency, where
a client's path may lead - lives here once.

* :class:`Core` (:mod:`.ops`): the operations;
* :class:`Served` (:mod:`.served`): the served tables by name, one admission gate;
* :mod:`.lifecycle` and :mod:`.persistence`: the core's table and persistence operations;
* :class:`TableHandle` (:mod:`.handle`): one served table, its calls off the loop;
* :mod:`.waiting`: rate-limited calls wait on the loop, no thread held;
* :mod:`.paths`: client paths confined to the data root's areas;
* :mod:`.startup`: reopen, restore, create on start; periodic checkpoints.
"""

from .handle import TableHandle
from .ops import Core
from .served import Served
from .shape import Shape
from .startup import PeriodicCheckpoints, load_specs, load_tables

__all__ = [
    "Core",
    "PeriodicCheckpoints",
    "Served",
    "Shape",
    "TableHandle",
    "load_specs",
    "load_tables",
]
