"""The pure-Python twin of ``_native_alloc.c``: ``FastLaunch.empty`` (see :mod:`.fast`).

The same steps in the same order: everything is checked first, and any surprise
returns None before a state changes (the caller then takes the Python route); then the
release queue is drained as ``SliceTable.drain`` and ``_forget`` drain it, the matched
slice goes to a new handle, and the stream's cursor and the stamps move as ``create``
moves them.
"""

from __future__ import annotations

from types import MemberDescriptorType
from typing import Any

from ...errors import InvalidArgument

__all__ = ["Allocator"]

_MAX_RELEASED = 16  # more dropped at once: the route drains them
_MAX_PENDING = 64  # more pending in the manager: the route releases them
_MAX_CARRIED = 64  # more address entries kept for pending slices: start again
_HANDLE_SLOTS = ("memory", "offset_start", "offset_end", "stream", "cursor", "buffer_size")


class _Plan:
    __slots__ = ("ids", "launch", "match", "pending")

    def __init__(self, launch: Any, ids: tuple[int, ...]) -> None:
        self.launch, self.ids = launch, ids
        self.match = -1
        self.pending: int | None = None


class Allocator:
    """What the twin's ``FastLaunch.set_alloc`` takes (its argument checks are the C
    module's), and ``empty``, run for that FastLaunch."""

    __slots__ = ("carried", "created_at", "failed", "handle_t", "ids", "manager",
                 "max_alloc", "mslices", "pending", "released", "slices",
                 "token_t")  # fmt: skip

    def __init__(self, handle_t: Any, token_t: Any, ids: Any, slices: Any, failed: Any,
                 released: Any, created_at: Any, manager: Any, mslices: Any, pending: Any,
                 max_alloc: int) -> None:  # fmt: skip
        dicts = (slices, failed, created_at, mslices)
        if (
            not (isinstance(handle_t, type) and isinstance(token_t, type))
            or not hasattr(ids, "__next__")
            or not all(isinstance(d, dict) for d in dicts)
            or max_alloc < 0
        ):
            raise InvalidArgument("set_alloc needs two types, an iterator, dicts and a size >= 0")
        for t, names in ((handle_t, _HANDLE_SLOTS), (token_t, ("id", "queue"))):
            missing = [n for n in names if not _has_slot(t, n)]
            if missing:
                raise InvalidArgument(f"{t!r} must keep {missing[0]!r} in __slots__")
        self.handle_t, self.token_t, self.ids, self.slices = handle_t, token_t, ids, slices
        self.failed, self.released, self.created_at = failed, released, created_at
        self.manager, self.mslices, self.pending = manager, mslices, pending
        self.max_alloc = max_alloc
        self.carried: dict[int, tuple[Any, Any, Any, Any]] = {}
        """Slice id -> (address entry, slice, page, offset) of a dropped slice the manager
        got back, for a later handle that takes it while it is still that range."""

    def empty(self, fast: Any, size: Any) -> Any:
        """A new Handle over a dropped slice of ``size`` bytes, or None (see fast.py)."""
        try:
            plan = self._plan(fast, size)
        except Exception:  # the Python route meets (and raises) whatever stopped this one
            plan = None
        if plan is None:
            fast._declined += 1
            return None
        handle = self._mint(fast, plan, size)
        fast.channel.ran_inline()  # as _native_fast.c's after()
        fast._hits += 1
        return handle

    def _plan(self, fast: Any, size: Any) -> _Plan | None:
        if type(size) is not int or not 0 < size <= self.max_alloc:
            return None
        p = fast._new_plan()
        if not fast._channel_ready(p) or not fast._stream_of(p):
            return None
        pool = self._pool_for(size)
        plan = _Plan(p, tuple(self.released))
        if pool is None or len(plan.ids) > _MAX_RELEASED:
            return None
        for i, sid in enumerate(plan.ids):
            if not self._free_at_once(fast, sid):
                return None
            if plan.match < 0 and self._fits(sid, size, pool):
                plan.match = i
        if plan.match < 0:
            plan.pending = self._pending_fit(size, pool)
        if plan.match < 0 and plan.pending is None:
            return None
        own = p.sid.value % fast.max_streams
        return plan if fast._clear_of(p, ()) and fast._wrapper_of(p, own) else None

    def _pool_for(self, size: int) -> Any:
        """The pool a reservation of ``size`` goes to (None: the persistent mode)."""
        m = self.manager
        if m._use_persistent is not False:
            return None
        for limit, pool in zip(m._limits, m._routes, strict=True):
            if limit >= size:
                return pool
        return None

    def _free_at_once(self, fast: Any, sid: int) -> bool:
        last = fast.last_use.get(sid)
        if last is None:
            return True
        created = self.created_at.get(sid)
        if created is last or (created is not None and last == created):
            return True
        wrapper = fast.slots[last[0].value % fast.max_streams]
        return wrapper is not None and wrapper.done >= last[1]

    def _fits(self, sid: int, size: int, pool: Any) -> bool:
        memory = self.slices.get(sid)
        if type(memory) is not self.token_t:
            return False  # an imported buffer's owner stands there too: never reused
        token: Any = memory
        return self._slice_fits(token.id, size, pool)

    def _slice_fits(self, slice_id: int, size: int, pool: Any) -> bool:
        sl = self.mslices.get(slice_id)
        return sl is not None and sl.used == size and sl.pool is pool

    def _pending_fit(self, size: int, pool: Any) -> int | None:
        pending = tuple(self.pending)
        if not 0 < len(pending) <= _MAX_PENDING:
            return None
        return next((i for i in pending if self._slice_fits(i, size, pool)), None)

    def _mint(self, fast: Any, plan: _Plan, size: int) -> Any:
        memory: Any = None
        entry: Any = None
        for i, sid in enumerate(plan.ids):
            self.released.popleft()  # a thread may append meanwhile: not clear()
            mem = self.slices.pop(sid, None)
            ent = fast.addresses.pop(sid, None)
            if self.failed:
                self.failed.pop(sid, None)
            fast.last_use.pop(sid, None)
            self.created_at.pop(sid, None)
            if i == plan.match:
                memory, entry = mem, ent
            else:
                self._carry(mem, ent)
        manager = self.manager
        if plan.pending is not None:  # reserved again under a new token
            self.pending.remove(plan.pending)
            memory = self.token_t(plan.pending, manager.queue)
            entry = self._carried(plan.pending, size)  # its address, where still valid
        p = plan.launch
        p.mids = []
        stamp = fast._commit(p)
        new_id = next(self.ids)
        token = self.token_t(new_id, fast.table.queue)
        handle = self.handle_t(token, None, None, p.sid, stamp[1], size)
        self.slices[new_id] = memory
        if entry is not None:
            fast.addresses[new_id] = entry
        fast.last_use[new_id] = self.created_at[new_id] = stamp
        n = manager._alloc_calls = manager._alloc_calls + 1
        if n >= manager._next_check:  # as reserve: every tick's calls, the pools' policy
            manager._periodic_cleanup(n)
        return handle

    def _carry(self, memory: Any, entry: Any) -> None:
        """Keep the address entry of a dropped slice the manager gets back (pending),
        with the slice's range (as ``_native_alloc.c``'s ``carry``)."""
        if memory is None or entry is None or type(memory) is not self.token_t:
            return
        token: Any = memory
        slice_id = token.id
        sl = self.mslices.get(slice_id)
        if sl is None:
            return
        if len(self.carried) >= _MAX_CARRIED:
            self.carried.clear()
        self.carried[slice_id] = (entry, sl, sl.page, sl.offset)

    def _carried(self, slice_id: int, size: int) -> Any:
        """The address entry kept for slice ``slice_id`` if it is still the range it was
        and covers ``size`` bytes, else None."""
        kept = self.carried.pop(slice_id, None)
        if kept is None:
            return None
        entry, sl, page, offset = kept
        if self.mslices.get(slice_id) is not sl or sl.page is not page or sl.offset != offset:
            return None
        return entry if entry[1] == size else None


def _has_slot(t: type, name: str) -> bool:
    """``name`` is a slot of ``t`` (a ``__slots__`` entry or a C member), as C's
    ``member_offset`` finds it: the first class of the MRO to define it has a member."""
    for k in t.__mro__:
        if name in k.__dict__:
            return isinstance(k.__dict__[name], MemberDescriptorType)
    return False
