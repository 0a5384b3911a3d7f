"""Memory management: slices of storage pages, handed out as reference-counted handles.

A port of cubecl-runtime's ``MemoryManagement``. Each request is routed through an
ordered list of pools (the first pool whose maximum allocation size fits wins; see
:mod:`.config` for the presets), or to the persistent pool while a persistent window is
open. The pool serves it from a free slice, or grows by one page from the
:class:`~.storage.ComputeStorage`.

Handle lifetime
    :meth:`MemoryManagement.reserve` returns a :class:`SliceHandle`. Every ``Handle`` and
    ``Binding`` over the slice shares that object; when the last reference is gone,
    CPython runs ``SliceHandle.__del__`` on whatever thread dropped it, which appends
    the slice id to the manager's :class:`ReleaseQueue` (``deque.append``: atomic, no
    lock). The manager drains the queue on its owner thread at the start of
    :meth:`~MemoryManagement.reserve`, :meth:`~MemoryManagement.memory_usage`,
    :meth:`~MemoryManagement.report` and :meth:`~MemoryManagement.cleanup`, and only then
    does the slice go back to its pool. Nothing on the reserve path takes a lock.

Threads
    Only ``SliceHandle.__del__`` may run on other threads. Every method of the manager,
    and of its pools and storage, runs on the owner thread (the server's actor).

Cross-stream safety
    The manager knows nothing of streams. A slice may be reused as soon as its last
    handle is dropped, so the server must keep a reference to the ``SliceHandle`` (a
    binding) until every stream that uses the slice has passed it: queued work holds the
    bindings it touches (a resource, a numpy view or a device pointer, does not keep the
    slice), and the ``MultiStream`` keeps bindings shared across streams until the
    origin's event has completed. A slice that comes back to its pool is therefore free
    on every stream.

One manager per server (bounded growth)
    A server owns exactly ONE ``MemoryManagement``, shared by all of its streams. Pools
    are not kept per stream: with a pool per stream each grows to its own peak, and many
    short-lived tasks (each on its own stream) multiply the reservation (the growth
    reported in burn#4991). With one manager, memory released by a finished task is
    reused by the next, so the reservation follows the peak of the live data, not the
    number of streams that ever existed.

Growth
    A pool grows by a page only when no free slice fits. With ``MemoryConfig.cache_ratio``
    (the default preset's 0.1), the manager first releases empty pages, largest first,
    beyond that fraction of its other pages, so what it reserves tracks what is live.

Failures
    A request larger than :attr:`~MemoryManagement.max_allocation`, or negative, raises
    ``BufferTooBig``. When the storage runs out of memory the manager runs one explicit
    cleanup (releasing empty pages of every pool) and retries once; a second failure
    raises ``OutOfMemory`` naming the size requested and the bytes reserved. Neither
    failure disturbs any live slice. Unknown, freed, foreign or closed handles raise
    ``InvalidHandle``.

Where the code is
    This module holds the manager; :mod:`.report` its report, :mod:`.routing` how pools
    are built and chosen, :mod:`.pools` the pools themselves.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import operator
from bisect import bisect_left
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Final, Generic, TypeVar

from ..errors import BufferTooBig, InvalidArgument, InvalidHandle, MemoryInUse, OutOfMemory
from ..values.types import MemoryAllocationMode, MemoryUsage
from .config import DEFAULT_MAX_ALLOCATION, MemoryConfig
from .growth import Growth
from .pools import Pool, Slice
from .report import MemoryReport
from .routing import build_persistent, build_pool, routing, tick_period
from .slice import ReleaseQueue, SliceHandle
from .storage import ComputeStorage, StorageHandle, StorageOutOfMemory

__all__ = ["MemoryManagement", "MemoryReport"]

R = TypeVar("R")

logger = logging.getLogger("asynccube.memory")


class MemoryManagement(Growth, Generic[R]):
    """Reserves slices of storage pages and takes them back when their handles die.

    Args:
        storage: Where pages come from (its ``alignment`` aligns every slice).
        config: The pool layout; :meth:`MemoryConfig.default` when ``None``.
        owner_id: Identifies the owner (the client); stamped on the release queue, and
            so on every handle, to recognise foreign handles.

    Attributes:
        storage: The storage.
        queue: Where dropped slice ids wait for the owner thread.
        max_allocation: The largest single allocation allowed.
        alignment: The storage's alignment.
    """

    __slots__ = (
        "_alloc_calls", "_cache_ratio", "_cap", "_first_limit", "_first_pool", "_high_water",
        "_ids", "_limits", "_next_check", "_over_high_water", "_pending", "_persistent_depth",
        "_routes", "_slices", "_tick", "_use_persistent", "alignment", "before_grow", "closed",
        "config", "max_allocation", "persistent_pool", "pools", "queue", "storage",
    )  # fmt: skip

    def __init__(
        self, storage: ComputeStorage[R], config: MemoryConfig | None = None, *, owner_id: int
    ) -> None:
        self.storage: ComputeStorage[R] = storage
        self.alignment: Final = storage.alignment
        self.queue: Final = ReleaseQueue(owner_id)
        self._pending = self.queue._queue
        self._slices: dict[int, Slice] = {}
        self._ids = itertools.count(1)
        self._alloc_calls = 0
        self._persistent_depth = 0
        self._build(MemoryConfig.default() if config is None else config)
        self.closed = False
        self.before_grow: Callable[[], object] | None = None
        """Called before a pool grows by a page: a server releases there what handles
        dropped since its last collection held, so that a slice they freed is reused
        instead of a new page (a page of hundreds of MiB costs milliseconds)."""

    def _build(self, config: MemoryConfig) -> None:
        """Build the pools of ``config`` (their initial pages mapped) and the routes."""
        self.config = config
        ids = self._ids
        self.pools: list[Pool] = []
        try:
            for options in config.pool_options(self.alignment, self._limit()):
                pool = build_pool(options, self.alignment, self._slices, ids, self.storage)
                self.pools.append(pool)
        except StorageOutOfMemory as exc:
            for built in self.pools:
                built.release_all(self.storage)
            raise OutOfMemory(exc.size, self.bytes_reserved, exc.detail) from exc
        self.max_allocation: int = min(self._limit(), max(p.max_alloc_size for p in self.pools))
        self._cap = self.max_allocation
        self.persistent_pool = build_persistent(
            config.persistent, self.max_allocation, self.alignment, self._slices, ids
        )
        self._limits, self._routes = routing(self.pools)
        self._first_limit, self._first_pool = self._limits[0], self._routes[0]
        self._use_persistent = bool(self._persistent_depth) or config.persistent_size_match
        self._cache_ratio = config.cache_ratio
        self._high_water = config.high_water
        self._over_high_water = False
        self._tick = tick_period(self.pools)
        self._next_check = self._alloc_calls + self._tick

    def live_slices(self) -> int:
        """How many slices are live (reserved and not yet released)."""
        self._drain()
        return sum(1 for sl in self._slices.values() if sl.used >= 0)

    def replace(self, config: MemoryConfig) -> None:
        """Empty every pool, give its pages back to the storage, and use ``config``'s
        pools from now on.

        Raises:
            MemoryInUse: slices are still live (nothing is changed).
            InvalidHandle: the manager is closed.
        """
        if self.closed:
            raise InvalidHandle("the memory manager is closed; open a new client")
        live = self.live_slices()
        if live:
            raise MemoryInUse(live)
        old = self.config
        if config.high_water is None and old.high_water is not None:  # a setting, kept
            config = dataclasses.replace(config, high_water=old.high_water)
        for pool in self._all_pools():
            pool.release_all(self.storage)
        try:
            self._build(config)
        except BaseException:
            self._build(old)
            raise

    def __repr__(self) -> str:
        return (
            f"MemoryManagement(owner={self.queue.owner_id}, pools={len(self.pools)}, "
            f"slices={len(self._slices)}, reserved={self.bytes_reserved})"
        )

    def _limit(self) -> int:
        limit = self.config.max_allocation
        if limit is None:
            limit = DEFAULT_MAX_ALLOCATION
            if self.storage.max_alloc is not None:
                limit = min(limit, self.storage.max_alloc)
        return limit

    # -- the hot path -------------------------------------------------------------------

    def reserve(self, size: int) -> SliceHandle:
        """A new slice of ``size`` bytes.

        Raises:
            BufferTooBig: ``size`` is negative or above :attr:`max_allocation`.
            InvalidArgument: ``size`` is not an integer.
            OutOfMemory: The storage failed even after a cleanup and one retry.
            InvalidHandle: The manager is closed.
        """
        pending = self._pending
        if pending:
            slices = self._slices
            while pending:
                sl = slices.get(pending.popleft())
                if sl is not None and sl.used >= 0:
                    sl.pool.release(sl)
            if self._over_high_water:
                self._trim_high_water()
        if size.__class__ is not int:
            size = self._as_size(size)
        if not 0 <= size <= self._cap:
            self._reject(size)
        n = self._alloc_calls = self._alloc_calls + 1
        if n >= self._next_check:
            self._periodic_cleanup(n)
        if self._use_persistent:
            sl = self._reserve_persistent(size)
        else:
            if size <= self._first_limit:  # the common case: no bisection
                pool = self._first_pool
            else:
                pool = self._routes[bisect_left(self._limits, size)]
            sl = pool.try_reserve(size) or self._grow(pool, size)
        return SliceHandle(sl.id, self.queue)

    def _drain(self) -> None:
        slices, pending = self._slices, self._pending
        while pending:
            sl = slices.get(pending.popleft())
            if sl is not None and sl.used >= 0:
                sl.pool.release(sl)
        if self._over_high_water and not self.closed:  # (a fast route may have released)
            self._trim_high_water()

    # -- the slow paths -----------------------------------------------------------------

    def _check_high_water(self) -> None:
        if self._high_water is not None and self.bytes_reserved > self._high_water:
            self._over_high_water = True  # trimmed once buffers are released

    def _trim_high_water(self) -> None:
        """Release empty pages, largest first, until the bytes reserved are at most
        ``high_water`` (or none is left); the flag stays up while live data exceeds it."""
        high_water = self._high_water
        if high_water is None:
            self._over_high_water = False
            return
        reserved = self.bytes_reserved
        if reserved > high_water:
            empty = [
                (page.handle.size, pool, page) for pool in self.pools for page in pool.empty_pages()
            ]
            empty.sort(key=lambda e: e[0], reverse=True)
            for page_bytes, pool, page in empty:
                pool.drop_empty_page(self.storage, page)
                reserved -= page_bytes
                if reserved <= high_water:
                    break
            logger.debug("memory above its high-water mark: %d bytes reserved now", reserved)
        self._over_high_water = reserved > high_water

    def _as_size(self, size: object) -> int:
        if not isinstance(size, bool):
            try:
                return operator.index(size)  # type: ignore[arg-type]
            except TypeError:
                pass
        raise InvalidArgument(f"a size must be an int number of bytes, got {size!r}")

    def _reject(self, size: int) -> None:
        if self.closed:
            raise InvalidHandle("the memory manager is closed; open a new client")
        if size < 0:
            raise BufferTooBig(size, "the size is negative")
        raise BufferTooBig(size, f"the largest allocation allowed is {self.max_allocation} bytes")

    def _reserve_persistent(self, size: int) -> Slice:
        persistent = self.persistent_pool
        if size > persistent.max_alloc_size:
            pass  # beyond the persistent pool's max_slice: the ordinary pools serve it
        elif self._persistent_depth or persistent.has_size(size):
            return persistent.try_reserve(size) or self._grow(persistent, size)
        pool = self._routes[bisect_left(self._limits, size)]
        return pool.try_reserve(size) or self._grow(pool, size)

    def _periodic_cleanup(self, n: int) -> None:
        """At least every 1024 calls: exclusive pages idle for their period are released,
        and sliced pools coalesce if many releases are pending (bounding that list)."""
        for pool in self.pools:
            pool.tick(self.storage, n)
        self._next_check = n + self._tick

    # -- lookups ------------------------------------------------------------------------

    def _slice(self, handle: SliceHandle) -> Slice:
        if handle.queue is not self.queue:
            raise InvalidHandle(
                f"slice {handle.id} belongs to another client (owner "
                f"{handle.queue.owner_id}, not {self.queue.owner_id})"
            )
        if self.closed:
            raise InvalidHandle("the memory manager is closed; open a new client")
        sl = self._slices.get(handle.id)
        if sl is None or sl.used < 0:
            raise InvalidHandle(f"slice {handle.id} is unknown or was freed")
        return sl

    def storage_handle(self, slice: SliceHandle) -> StorageHandle:
        """The storage range (id, offset, requested size) of ``slice``.

        Raises:
            InvalidHandle: ``slice`` is foreign, unknown or freed, or the manager closed.
        """
        return self._slice(slice).storage_handle()

    def resource(self, slice: SliceHandle, offset_start: int, size: int) -> R:
        """The storage resource of ``size`` bytes at ``offset_start`` within ``slice``.

        Raises:
            InvalidHandle: As :meth:`storage_handle`, or the range leaves the slice.
        """
        handle = self._slice(slice).storage_handle()
        if offset_start < 0 or size < 0 or offset_start + size > handle.size:
            raise InvalidHandle(
                f"range [{offset_start}, {offset_start + size}) is outside slice "
                f"{slice.id} of {handle.size} bytes"
            )
        return self.storage.resource(handle.sub(offset_start, size))

    def is_live(self, slice_id: int) -> bool:
        """True if ``slice_id`` names a live slice of this manager."""
        sl = self._slices.get(slice_id)
        return sl is not None and sl.used >= 0

    # -- accounting ---------------------------------------------------------------------

    @property
    def alloc_calls(self) -> int:
        """``reserve`` calls so far (the clock of the exclusive pools' dealloc period)."""
        return self._alloc_calls

    def _all_pools(self) -> Iterator[Pool]:
        yield from self.pools
        yield self.persistent_pool

    def memory_usage(self) -> MemoryUsage:
        """Allocations, bytes in use (requested), padding and bytes reserved."""
        self._drain()
        total = MemoryUsage()
        for pool in self._all_pools():
            total = total.combine(pool.usage())
        return total

    def report(self) -> MemoryReport:
        """The state of every pool."""
        self._drain()
        return MemoryReport(
            tuple(p.report() for p in self.pools), self.persistent_pool.report(), self._alloc_calls
        )

    def cleanup(self, explicit: bool) -> None:
        """Release unused pages: every empty page if ``explicit``, else by each pool's
        policy (exclusive pages idle for their dealloc period)."""
        self._drain()
        if self.closed:
            return
        before = self.bytes_reserved
        for pool in self._all_pools():
            pool.cleanup(self.storage, self._alloc_calls, explicit)
        if explicit:
            logger.debug("memory cleanup released %d bytes", before - self.bytes_reserved)

    # -- modes and lifetime -------------------------------------------------------------

    def mode(self, mode: MemoryAllocationMode) -> None:
        """Open (``PERSISTENT``) or close (``AUTO``) a persistent window.

        Windows nest: the effective mode is persistent while any window is open, so an
        inner window's ``AUTO`` does not end an outer one. An ``AUTO`` with no window
        open does nothing.
        """
        if mode is MemoryAllocationMode.PERSISTENT:
            self._persistent_depth += 1
        elif self._persistent_depth:
            self._persistent_depth -= 1
        self._use_persistent = bool(self._persistent_depth) or self.config.persistent_size_match

    @property
    def current_mode(self) -> MemoryAllocationMode:
        """``PERSISTENT`` while a persistent window is open, else ``AUTO``."""
        if self._persistent_depth:
            return MemoryAllocationMode.PERSISTENT
        return MemoryAllocationMode.AUTO

    @contextmanager
    def persistent(self) -> Iterator[None]:
        """A persistent window: allocations inside come from the persistent pool."""
        self.mode(MemoryAllocationMode.PERSISTENT)
        try:
            yield
        finally:
            self.mode(MemoryAllocationMode.AUTO)

    def close(self) -> None:
        """Invalidate every handle and give all pages back to the storage."""
        if self.closed:
            return
        self.closed = True
        self._cap = -1
        self.queue.closed = True
        self._pending.clear()
        for pool in self._all_pools():
            pool.release_all(self.storage)
