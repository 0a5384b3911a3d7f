"""Memory management: storages, pools, and the manager that routes between them.

See :mod:`.management` for the handle lifetime, the cross-stream safety argument and the
one-manager-per-server policy.

May import: the foundation and ``values`` only.
"""

from .config import (
    DEFAULT_CACHE_RATIO,
    DEFAULT_MAX_ALLOCATION,
    ExclusivePages,
    MemoryConfig,
    PoolOptions,
    SlicedPages,
)
from .management import MemoryManagement, MemoryReport
from .pools import ExclusivePool, PersistentPool, PoolReport, SlicedPool
from .report import SizeClassPeak
from .slice import ReleaseQueue, SliceHandle
from .storage import (
    BytesStorage,
    ComputeStorage,
    HostResource,
    StorageHandle,
    StorageOutOfMemory,
)

__all__ = [
    "DEFAULT_CACHE_RATIO",
    "DEFAULT_MAX_ALLOCATION",
    "BytesStorage",
    "ComputeStorage",
    "ExclusivePages",
    "ExclusivePool",
    "HostResource",
    "MemoryConfig",
    "MemoryManagement",
    "MemoryReport",
    "PersistentPool",
    "PoolOptions",
    "PoolReport",
    "ReleaseQueue",
    "SizeClassPeak",
    "SliceHandle",
    "SlicedPages",
    "SlicedPool",
    "StorageHandle",
    "StorageOutOfMemory",
]
