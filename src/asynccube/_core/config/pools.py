"""Memory pool layouts, public and typed: :class:`MemoryLayout`, a list of
:class:`MemoryPool` s, each of a :class:`PoolKind` (cubecl's ``MemoryPoolOptions`` and
``PoolType``, with a cap on each pool's total size).

Routing (as cubecl's): a request goes to the first pool, in order, whose ``max_slice``
is at least its size. A capped pool (``max_total``) that is full, once its own empty
pages are released, spills the request to the next pool, in order, that accepts the
size; when none does, the request fails with ``OutOfMemory``. The persistent pool (at
most one) is outside that order: it serves the persistent windows
(``MemoryAllocationMode.PERSISTENT``), and spills to the ordinary pools when capped
and full.

The rules, checked when a layout (or a pool) is built, each broken one a
:class:`~asynccube.MemoryLayoutError` naming the pool's index:

- every size is an int > 0 (``max_slice``, ``page_size``, ``max_total``), ``initial`` >= 0;
- a sliced pool has a ``page_size``; the other kinds have none (each buffer has a page
  of its own size);
- a sliced pool's cap holds at least one page, and its ``initial`` pages fit its cap;
- no pool is unreachable: a pool whose every size is taken by an earlier uncapped pool
  (``max_slice`` not above it) would never serve a request;
- at least one ordinary (non-persistent) pool, and at most one persistent pool.

This module sits in the ``config`` layer so that the file's schema can parse
``[[memory.pools]]``; the memory manager turns a layout into pools.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from ..errors import MemoryLayoutError

__all__ = ["MemoryLayout", "MemoryPool", "PoolKind", "parse_pools", "pools_toml"]


class PoolKind(enum.StrEnum):
    """What a pool does with the pages it takes from the device (or host)."""

    SLICED = "sliced"
    """Pages of ``page_size`` bytes carved into slices, reused best-fit."""
    EXCLUSIVE = "exclusive"
    """A page per buffer, of the buffer's aligned size; free pages are reused by
    requests of about their size, and released after ``dealloc_period`` unused."""
    PERSISTENT = "persistent"
    """A page per buffer, reused only for the same aligned size; serves the persistent
    windows (``MemoryAllocationMode.PERSISTENT``)."""
    DIRECT = "direct"
    """One driver allocation per buffer, given back as soon as the buffer is released
    (nothing cached: the least memory held, the most driver calls)."""


@dataclass(frozen=True, slots=True)
class MemoryPool:
    """One pool of a :class:`MemoryLayout`.

    Args:
        kind: What the pool does (a :class:`PoolKind` or its name).
        max_slice: The largest request, in bytes, the pool accepts.
        page_size: Sliced pools only (and required there): the size of a page. A request
            larger than a page gets a page of its own, rounded up to a multiple of it.
        max_total: A cap on the bytes of the pages the pool holds at once; ``None``: no
            cap. A full pool spills to the next pool that accepts the size.
        dealloc_period: Exclusive pools only: a free page unused for about this many
            allocation calls is released; ``None``: only by ``memory_cleanup``.
        initial: Sliced pools only: bytes of pages (rounded up to whole pages) mapped when
            the layout is installed, so the first requests find them ready.

    Raises:
        MemoryLayoutError: a value breaks a rule (see :mod:`this module <.pools>`).
    """

    kind: PoolKind
    max_slice: int
    page_size: int | None = None
    max_total: int | None = None
    dealloc_period: int | None = None
    initial: int = 0

    def __post_init__(self) -> None:
        try:
            kind = PoolKind(self.kind)
        except ValueError:
            kinds = ", ".join(repr(str(k)) for k in PoolKind)
            raise MemoryLayoutError(f"kind {self.kind!r} is not one of {kinds}") from None
        object.__setattr__(self, "kind", kind)
        _size("max_slice", self.max_slice)
        if self.max_total is not None:
            _size("max_total", self.max_total)
        if self.dealloc_period is not None:
            _size("dealloc_period", self.dealloc_period)
            if kind is not PoolKind.EXCLUSIVE:
                raise MemoryLayoutError(f"dealloc_period applies to exclusive pools, not {kind}")
        _size("initial", self.initial, zero=True)
        if kind is PoolKind.SLICED:
            self._check_sliced()
        else:
            self._check_unsliced(kind)

    def _check_sliced(self) -> None:
        if self.page_size is None:
            raise MemoryLayoutError("a sliced pool needs a page_size (the size of its pages)")
        _size("page_size", self.page_size)
        if self.max_total is not None and self.max_total < self.page_size:
            raise MemoryLayoutError(
                f"max_total={self.max_total} is below one page ({self.page_size} bytes): "
                "the pool could never hold a page; raise max_total or lower page_size"
            )
        if self.max_total is not None and self.initial > self.max_total:
            raise MemoryLayoutError(
                f"initial={self.initial} is above max_total={self.max_total}; map at most the cap"
            )

    def _check_unsliced(self, kind: PoolKind) -> None:
        if self.page_size is not None:
            raise MemoryLayoutError(
                f"page_size applies to sliced pools only; a {kind} pool gives each "
                "buffer a page of its own size (drop page_size)"
            )
        if self.initial:
            raise MemoryLayoutError(f"initial applies to sliced pools only, not {kind}")

    def to_table(self) -> dict[str, object]:
        """The pool as a TOML table (``[[memory.pools]]``): the values that are set."""
        table: dict[str, object] = {"kind": str(self.kind), "max_slice": self.max_slice}
        for name in ("page_size", "max_total", "dealloc_period"):
            if getattr(self, name) is not None:
                table[name] = getattr(self, name)
        if self.initial:
            table["initial"] = self.initial
        return table


def _size(name: str, value: object, *, zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if zero else 1):
        raise MemoryLayoutError(
            f"{name}={value!r} must be an int {'>= 0' if zero else '> 0'} (bytes)"
            if name != "dealloc_period"
            else f"dealloc_period={value!r} must be an int > 0 (allocation calls)"
        )


@dataclass(frozen=True, slots=True)
class MemoryLayout:
    """A pool layout: the pools a client's memory manager routes requests through.

    Give one to a client in code (``open_client(config={"memory": {"pools": layout.pools}})``
    or ``await client.set_memory_layout(layout)``), or in the configuration file as
    ``[[memory.pools]]`` tables. ``MemoryReport.plan()`` builds one from what a run used.

    Args:
        pools: The pools, in routing order (a list or tuple of :class:`MemoryPool`).
        max_allocation: The largest single allocation; ``None``: the largest pool's
            ``max_slice``, within the device's (or host's) own limit.
        cache_ratio: Before a pool grows, empty pages beyond this fraction of the bytes of
            the other pages are released; ``None``: empty pages stay until
            ``memory_cleanup`` (or a pool's own ``dealloc_period``).

    Raises:
        MemoryLayoutError: the layout breaks a rule (see :mod:`this module <.pools>`).
    """

    pools: tuple[MemoryPool, ...]
    max_allocation: int | None = None
    cache_ratio: float | None = None

    def __post_init__(self) -> None:
        pools: object = self.pools
        if isinstance(pools, MemoryPool) or not isinstance(pools, Iterable):
            raise MemoryLayoutError(f"pools must be a list of MemoryPool, got {pools!r}")
        pools = tuple(pools)
        for index, pool in enumerate(pools):
            if not isinstance(pool, MemoryPool):
                raise MemoryLayoutError(f"{pool!r} is not a MemoryPool", index)
        object.__setattr__(self, "pools", pools)
        check_routes(pools)
        if self.max_allocation is not None:
            _size("max_allocation", self.max_allocation)
        ratio = self.cache_ratio
        if ratio is not None and (isinstance(ratio, bool) or not ratio >= 0):
            raise MemoryLayoutError(f"cache_ratio={ratio!r} must be None or a number >= 0")

    @property
    def routed(self) -> tuple[MemoryPool, ...]:
        """The ordinary pools, in routing order (every pool but the persistent one)."""
        return tuple(p for p in self.pools if p.kind is not PoolKind.PERSISTENT)

    @property
    def persistent(self) -> MemoryPool | None:
        """The persistent pool, if the layout has one."""
        return next((p for p in self.pools if p.kind is PoolKind.PERSISTENT), None)


def check_routes(pools: Sequence[MemoryPool]) -> None:
    """Raise MemoryLayoutError unless every pool of ``pools`` can serve some request."""
    persistent = [i for i, p in enumerate(pools) if p.kind is PoolKind.PERSISTENT]
    if len(persistent) > 1:
        raise MemoryLayoutError(
            "a layout has at most one persistent pool; merge them", persistent[1]
        )
    if len(persistent) == len(pools):
        raise MemoryLayoutError(
            "a layout needs at least one sliced, exclusive or direct pool (the persistent "
            "pool serves only the persistent windows)"
        )
    widest: tuple[int, int] | None = None  # (max_slice, index) of the widest uncapped pool
    for index, pool in enumerate(pools):
        if pool.kind is PoolKind.PERSISTENT:
            continue
        if widest is not None and pool.max_slice <= widest[0]:
            raise MemoryLayoutError(
                f"unreachable: pool {widest[1]} (no cap, up to {widest[0]} bytes) takes every "
                f"request this pool accepts (up to {pool.max_slice} bytes); give it a larger "
                f"max_slice, move it before pool {widest[1]}, or cap pool {widest[1]} "
                "(max_total) so that it spills here",
                index,
            )
        if pool.max_total is None and (widest is None or pool.max_slice > widest[0]):
            widest = (pool.max_slice, index)


# -- the file ------------------------------------------------------------------------


_KEYS = tuple(f.name for f in fields(MemoryPool))


def parse_pools(raw: object, from_env: bool) -> tuple[MemoryPool, ...]:
    """``[memory] pools`` from a file (a list of tables), code (MemoryPool s or mappings)
    or the environment (JSON text); checked as a layout.

    Raises:
        MemoryLayoutError: naming the pool and the rule it breaks.
    """
    if from_env and isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise MemoryLayoutError(f"not a JSON list of pool tables ({exc})") from None
    if isinstance(raw, MemoryLayout):
        return raw.pools
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        raise MemoryLayoutError(
            "expected a list of pools ([[memory.pools]] tables, or MemoryPool objects)"
        )
    pools = tuple(_pool(item, index) for index, item in enumerate(raw))
    if pools:
        check_routes(pools)
    return pools


def _pool(item: object, index: int) -> MemoryPool:
    if isinstance(item, MemoryPool):
        return item
    if not isinstance(item, Mapping):
        raise MemoryLayoutError(
            f"expected a table (kind = ..., max_slice = ...), got {item!r}", index
        )
    unknown = [k for k in item if k not in _KEYS]
    if unknown:
        raise MemoryLayoutError(
            f"unknown key {unknown[0]!r}; the keys are {', '.join(_KEYS)}", index
        )
    for needed in ("kind", "max_slice"):
        if needed not in item:
            raise MemoryLayoutError(f"missing key {needed!r}", index)
    try:
        return MemoryPool(**{str(k): v for k, v in item.items()})
    except MemoryLayoutError as exc:
        raise MemoryLayoutError(str(exc), index) from None


def pools_toml(pools: Sequence[MemoryPool]) -> str:
    """``pools`` as a TOML value: an array of inline tables."""
    return "[" + ", ".join(_inline(p.to_table()) for p in pools) + "]"


def _inline(table: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"
