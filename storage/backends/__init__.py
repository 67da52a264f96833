"""Storage backends: where a table's items live.

Every backend is allocated with ``TensorDict.from_schema(fields,
batch_size=[capacity], storage=...)``; this package adds what a replay table
needs on top and keeps each backend's I/O apart, one module each:

* :mod:`.base`: :class:`Backend`, what every backend offers a table (write
  rows, gather rows into reused buffers, flush, close, destroy).
* :mod:`.tensor`: :class:`TensorBackend` (``memory``, ``memmap``, ``shared``),
  one tensor per field.
* :mod:`.h5`: :class:`H5Backend` (``h5``), h5py datasets under a
  ``PersistentTensorDict``.
* :mod:`.redis`: :class:`RedisBackend` (``redis``), tensordict's
  ``TensorDictStore``, checked against a lost or flushed Redis.
* :mod:`.redis_keys`: a redis table's keys, laid out with no row (Redis memory
  grows with the rows), read, checked against the Redis's limits, deleted.
* :mod:`.redis_records`: a redis table's keys recorded under the data root until
  they are deleted; :func:`sweep_keys` deletes what a killed process left.
* :mod:`.locations`: where file backends keep their data (the table's own,
  marked folder) and the :class:`LocationClaim` an open backend holds on it;
  :func:`sweep` deletes dead data.
* :mod:`.allocation`: :func:`allocate`, a fresh backend for a spec.
* :mod:`.reopen`: :func:`stored_specs` and :func:`reopen`, the memmap tables a
  process left under a data root.

HDF5 and Redis cannot hold bfloat16, so those fields are stored as int16 with
the same bits and viewed back on read.
"""

from .allocation import allocate
from .base import Backend, Rows
from .h5 import H5Backend
from .locations import MARKER, LocationClaim, primary_location, sweep
from .redis import RedisBackend
from .redis_records import sweep_keys
from .reopen import reopen, stored_specs
from .tensor import TensorBackend

__all__ = [
    "MARKER",
    "Backend",
    "H5Backend",
    "LocationClaim",
    "RedisBackend",
    "Rows",
    "TensorBackend",
    "allocate",
    "primary_location",
    "reopen",
    "stored_specs",
    "sweep",
    "sweep_keys",
]
