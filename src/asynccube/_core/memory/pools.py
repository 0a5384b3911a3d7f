"""Memory pools: how pages from a storage are carved into slices.

Four pools, as in cubecl-runtime (and a direct one):

- :class:`SlicedPool` carves fixed-size pages into slices. A free slice of exactly the
  (aligned) size asked for is reused first; otherwise the smallest free slice that is
  large enough is split. Free neighbours are coalesced lazily: releasing a slice only
  puts it back in its size bucket (the hot path), and the slices released since the last
  pass are merged with their free neighbours when a request finds no fit, before the
  pool grows by a page. Pages are given back to the storage by an explicit cleanup, or
  by the manager's ``cache_ratio`` policy when it grows (see :mod:`.config`).
- :class:`ExclusivePool` gives each slice a page of its own. Free pages are reused for
  requests they fit (within ``max_waste``) and released after a period of disuse counted
  in allocation calls.
- :class:`DirectPool` gives each slice a storage allocation of its own and gives it
  back as soon as the slice is released (nothing cached).
- :class:`~.expandable.ExpandablePool` carves one reserved range of device addresses,
  backed by physical chunks on demand and grown in place (CUDA's virtual memory API).
- :class:`PersistentPool` allocates each slice exactly and reuses it only for a request
  of the same aligned size (weights, caches: allocated once, kept for long).

Every method runs on the memory manager's owner thread. The pools never see a
:class:`SliceHandle`: the slices register in the manager's table (id -> :class:`Slice`),
and a handle carries the id. An id names a slice for as long as the slice exists, across
reservations, so reserving a free slice again touches no table; ids are never shared
by two slices alive at once.
Free-slice lookups are dictionary hits on the aligned size, falling back to a bisection
over the sorted sizes present, so the reserve path allocates no big structure.

Where the code is: :mod:`.pages` (pages, slices, free-slice buckets, reports, the pools'
base class), :mod:`.chain` (what the sliced and expandable pools share: splitting and
lazy coalescing), :mod:`.sliced` (the sliced pool), :mod:`.expandable` (the expandable
pool), :mod:`.exclusive` (the exclusive and persistent pools); this module gathers them.
"""

from __future__ import annotations

from .chain import _MAX_DIRTY as _MAX_DIRTY
from .exclusive import DirectPool, ExclusivePool, PersistentPool
from .expandable import ExpandablePool
from .pages import DEAD, FREE, Page, PoolReport, Slice
from .sliced import SlicedPool

__all__ = [
    "DEAD",
    "FREE",
    "DirectPool",
    "ExclusivePool",
    "ExpandablePool",
    "Page",
    "PersistentPool",
    "Pool",
    "PoolReport",
    "Slice",
    "SlicedPool",
]

Pool = SlicedPool | ExclusivePool | DirectPool | ExpandablePool
"""Any dynamic pool."""
