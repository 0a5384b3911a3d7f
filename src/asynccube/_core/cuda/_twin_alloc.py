"""The pure-Python twin of ``_native_alloc.c``: ``FastLaunch.empty`` (see :mod:`.fast`).

The same steps in the same order: everything is checked first, and any surprise
returns None before a state changes (the caller then takes the Python route); then the
release queue is drained as ``SliceTable.drain`` and ``_forget`` drain it, the matched
slice goes to a new handle, and the stream's cursor and the stamps move as ``create``
moves them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["AllocPart"]

_MAX_RELEASED = 16  # more dropped at once: the route drains them
_MAX_PENDING = 64  # more pending in the manager: the route releases them


class AllocPart:
    """``FastLaunch``'s ``set_alloc`` and ``empty`` (a base of the twin's FastLaunch)."""

    __slots__ = ("_alloc",)

    _alloc: Any

    def set_alloc(self, handle_t: Any, token_t: Any, ids: Any, slices: Any, failed: Any,
                  released: Any, created_at: Any, manager: Any, mslices: Any, pending: Any,
                  max_alloc: int) -> None:  # fmt: skip
        """What :meth:`empty` needs (see ``_native_alloc.c``)."""
        from ..errors import InvalidArgument

        dicts = (slices, failed, created_at, mslices)
        if (
            not (isinstance(handle_t, type) and isinstance(token_t, type))
            or not hasattr(ids, "__next__")
            or not all(isinstance(d, dict) for d in dicts)
            or max_alloc < 0
        ):
            raise InvalidArgument("set_alloc needs two types, an iterator, dicts and a size >= 0")
        for t, names in ((handle_t, _HANDLE_SLOTS), (token_t, ("id", "queue"))):
            missing = [n for n in names if n not in _slots_of(t)]
            if missing:
                raise InvalidArgument(f"{t!r} must keep {missing[0]!r} in __slots__")
        self._alloc = (handle_t, token_t, ids, slices, failed, released, created_at, manager,
                       mslices, pending, max_alloc)  # fmt: skip

    def empty(self, size: Any) -> Any:
        """A new Handle over a dropped slice of ``size`` bytes, or None (see fast.py)."""
        fast: Any = self
        if getattr(self, "_alloc", None) is None:
            return None
        try:
            plan = self._plan_alloc(fast, size)
        except Exception:  # the Python route meets (and raises) whatever stopped this one
            plan = None
        if plan is None:
            fast._declined += 1
            return None
        handle = self._mint(fast, plan, size)
        fast.channel.ran_inline()  # as _native_fast.c's after()
        fast._hits += 1
        return handle

    def _plan_alloc(self, fast: Any, size: Any) -> tuple[Any, ...] | None:
        max_alloc = self._alloc[10]
        if type(size) is not int or not 0 < size <= max_alloc:
            return None
        p = fast._new_plan()
        if not fast._channel_ready(p) or not fast._stream_of(p):
            return None
        pool = self._manager_ready(size)
        ids = tuple(self._alloc[5])
        if pool is None or len(ids) > _MAX_RELEASED:
            return None
        match, pending = -1, None
        for i, sid in enumerate(ids):
            if not self._free_at_once(fast, sid):
                return None
            if match < 0 and self._fits(sid, size, pool):
                match = i
        if match < 0:
            pending = self._pending_fit(size, pool)
        if (match < 0 and pending is None) or not fast._wrapper_of(
            p, p.sid.value % fast.max_streams
        ):
            return None
        return p, ids, match, pending

    def _manager_ready(self, size: int) -> Any:
        m = self._alloc[7]
        if m._use_persistent is not False:
            return None  # the persistent mode: the route reserves
        for limit, pool in zip(m._limits, m._routes, strict=True):
            if limit >= size:
                return pool
        return None

    def _free_at_once(self, fast: Any, sid: int) -> bool:
        last = fast.last_use.get(sid)
        if last is None:
            return True
        created = self._alloc[6].get(sid)
        if created is last or (created is not None and last == created):
            return True
        wrapper = fast.slots[last[0].value % fast.max_streams]
        return wrapper is not None and wrapper.done >= last[1]

    def _fits(self, sid: int, size: int, pool: Any) -> bool:
        memory = self._alloc[3].get(sid)  # a pool slice's token, not an imported owner
        return type(memory) is self._alloc[1] and self._slice_fits(memory.id, size, pool)

    def _slice_fits(self, slice_id: int, size: int, pool: Any) -> bool:
        sl = self._alloc[8].get(slice_id)
        return sl is not None and sl.used == size and sl.pool is pool

    def _pending_fit(self, size: int, pool: Any) -> int | None:
        pending = tuple(self._alloc[9])
        if not 0 < len(pending) <= _MAX_PENDING:
            return None
        return next((i for i in pending if self._slice_fits(i, size, pool)), None)

    def _mint(self, fast: Any, plan: tuple[Any, ...], size: int) -> Any:
        p, ids, match, pending = plan
        handle_t, token_t, id_iter, slices, failed, released, created_at, manager = self._alloc[:8]
        memory = entry = None
        for i, sid in enumerate(ids):
            released.popleft()  # a thread may append meanwhile: not clear()
            mem = slices.pop(sid, None)
            ent = fast.addresses.pop(sid, None)
            if failed:
                failed.pop(sid, None)
            fast.last_use.pop(sid, None)
            created_at.pop(sid, None)
            if i == match:
                memory, entry = mem, ent
        if pending is not None:  # reserved again under a new token
            self._alloc[9].remove(pending)
            memory = token_t(pending, manager.queue)
        p.mids = []
        stamp = fast._commit(p)
        new_id = next(id_iter)
        handle = handle_t(token_t(new_id, fast.table.queue), None, None, p.sid, stamp[1], size)
        slices[new_id] = memory
        if entry is not None:
            fast.addresses[new_id] = entry
        fast.last_use[new_id] = created_at[new_id] = stamp
        n = manager._alloc_calls = manager._alloc_calls + 1
        if n >= manager._next_check:  # as reserve: every tick's calls, the pools' policy
            manager._periodic_cleanup(n)
        return handle


_HANDLE_SLOTS = ("memory", "offset_start", "offset_end", "stream", "cursor", "buffer_size")


def _slots_of(t: type) -> set[str]:
    return {name for k in t.__mro__ for name in getattr(k, "__slots__", ())}
