"""Scenarios of the one-call allocation route (``FastLaunch.empty``, ``cuda/fast.py``)
on the real client -> channel -> CudaServer path against the no-op driver of
``benchmarks/bench_overhead.py``.

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_alloc_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fast_launch_scenario import ADD, N, Setup, U, ac, main
from tasks import actor_idle

SIZE = 4 * N  # the add kernel's buffers


def tables(s: Setup) -> tuple[dict[int, Any], dict[int, Any], dict[int, Any]]:
    """The slice table, the last-use stamps and the creation stamps of ``s``'s server."""
    server = s.server
    return server._table._slices, server._streams.last_use, server._created_at


def bindings(h: ac.Handle) -> ac.Bindings:
    """The add kernel's bindings with ``h`` as its output."""
    b = [x.binding() for x in (h, h, h)]
    return ac.Bindings().with_buffers(b).with_scalar(np.uint32, [N])


async def alloc_taken() -> None:
    """A dropped slice of the same size goes to the next handle, with the route's
    bookkeeping; the pool's usage does not move, and the handle works."""
    s = await Setup().ready()
    c = s.client
    slices, last_use, created = tables(s)
    h = c.empty(SIZE)
    old, token = h.memory.id, slices[h.memory.id]
    before = await c.memory_usage()
    del h
    hits, d0 = s.stats
    h = c.empty(SIZE)
    assert s.stats == (hits + 1, d0), s.stats
    new = h.memory.id
    assert new != old and slices[new] is token, (old, new)
    assert old not in slices and old not in last_use and old not in created
    assert last_use[new] == created[new] == (h.stream, h.cursor), (last_use[new], h)
    assert h.stream == ac.StreamId.current() and h.size == SIZE and h.offset_start is None
    assert await c.memory_usage() == before
    c.execute(ADD, s.count, bindings(h), U)  # the address of the old handle carried over
    (data,) = await c.read([h])
    assert len(data) == SIZE
    kept = h.binding()
    del h
    d1 = s.stats[1]
    assert c.empty(SIZE) is not None and s.stats[1] == d1 + 1, s.stats  # a binding keeps it
    assert slices[kept.memory.id] is token
    await c.close()


def taken(s: Setup, size: Any) -> tuple[ac.Handle, bool]:
    """``s.client.empty(size)`` and whether the one-call route took it."""
    hits = s.stats[0]
    h = s.client.empty(size)
    return h, s.stats[0] == hits + 1


async def alloc_declined() -> None:
    """Another size, an int that is not exactly int, a slice the device may still use,
    the persistent mode, or many drops at once: the route (a cleanup due: run here)."""
    s = await Setup().ready()
    c = s.client
    slices, _, _ = tables(s)
    h = c.empty(SIZE)
    old = h.memory.id
    del h
    h, hit = taken(s, 2 * SIZE)  # the route drains the dropped slice
    assert not hit and old not in slices
    del h
    h = c.empty(SIZE)
    c.execute(ADD, s.count, bindings(h), U)  # used by the device, not yet passed
    del h
    h, hit = taken(s, SIZE)
    assert not hit
    await c.sync()
    del h
    h, hit = taken(s, np.int64(SIZE))
    assert not hit and h.size == SIZE
    del h
    c.allocation_mode(ac.MemoryAllocationMode.PERSISTENT)
    h, hit = taken(s, SIZE)
    assert not hit
    c.allocation_mode(ac.MemoryAllocationMode.AUTO)
    del h
    h, hit = taken(s, SIZE)
    assert not hit  # the slice dropped is a persistent one
    del h
    memory = s.server._memory
    memory._next_check = memory._alloc_calls + 1  # the periodic cleanup is due: run too
    h, hit = taken(s, SIZE)
    assert hit and memory._next_check > memory._alloc_calls
    many = [c.empty(SIZE) for _ in range(17)]
    del many, h
    h, hit = taken(s, SIZE)
    assert not hit
    del h
    assert taken(s, SIZE)[1]  # the route drained the 17: the one just dropped is taken
    await c.close()


async def alloc_passed() -> None:
    """A slice a completed sync saw the device pass is free at once: taken."""
    s = await Setup().ready()
    c = s.client
    h = c.empty(SIZE)
    token = s.server._table._slices[h.memory.id]
    c.execute(ADD, s.count, bindings(h), U)
    await c.sync()
    del h
    hits, d0 = s.stats
    h = c.empty(SIZE)
    assert s.stats == (hits + 1, d0) and s.server._table._slices[h.memory.id] is token
    await c.close()


async def alloc_other_task() -> None:
    """A slice the server let go of at the end of a loop iteration (pending in the
    manager), never used by the device, goes to another task's handle on its stream."""
    s = await Setup().ready()
    c = s.client
    h = c.empty(SIZE)
    await c.sync()  # the actor has run the allocation: the handle is the only reference
    slice_id = s.server._table._slices[h.memory.id].id
    before = await c.memory_usage()
    del h
    hits, d0 = s.stats

    async def other() -> ac.Handle:
        return c.empty(SIZE)

    h = await asyncio.create_task(other())
    assert s.stats == (hits + 1, d0), s.stats
    assert s.server._table._slices[h.memory.id].id == slice_id
    assert h.stream != ac.StreamId.current() and slice_id not in s.server._memory._pending
    assert await c.memory_usage() == before
    c.execute(ADD, s.count, bindings(h), U)
    (data,) = await c.read([h])
    assert len(data) == SIZE
    await c.close()


async def alloc_create() -> None:
    """``create`` takes a dropped slice of its size in one call and writes into it."""
    s = await Setup().ready()
    c = s.client
    h = c.empty(SIZE)
    await c.sync()
    slice_id = s.server._table._slices[h.memory.id].id
    del h
    hits = s.stats[0]
    h = c.create(bytes(SIZE))
    assert s.stats[0] == hits + 1 and h.size == SIZE, s.stats
    assert s.server._table._slices[h.memory.id].id == slice_id
    _, last_use, created = tables(s)
    assert last_use[h.memory.id][1] > created[h.memory.id][1]  # the copy followed
    (data,) = await c.read([h])
    assert len(data) == SIZE
    await c.close()


async def alloc_errors() -> None:
    """Bad sizes still raise the route's errors, and a closed client raises."""
    s = await Setup().ready()
    c = s.client
    h = c.empty(SIZE)
    del h
    for bad, error in ((-1, ac.InvalidArgument), (1 << 62, ac.BufferTooBig),
                       (1.5, ac.InvalidArgument)):  # fmt: skip
        try:
            c.empty(bad)  # type: ignore[arg-type]
        except error:
            pass
        else:
            raise AssertionError(f"empty({bad!r}) did not raise {error.__name__}")
    await c.close()
    try:
        c.empty(SIZE)
    except ac.ClientClosedError:
        pass
    else:
        raise AssertionError("a closed client allocated")


async def alloc_after_read() -> None:
    """A completed read marks its stream done up to the read, as a sync does: a slice
    last used there before it is free at once when dropped, taken by the next handle
    without a sync, after a read through the route (the first of its size, a large one)
    and through the one-call route; a slice used after the read is not."""
    s = await Setup().ready()
    c = s.client
    slices = s.server._table._slices
    for size, read_taken in ((SIZE, False), (SIZE, True), (128 << 10, False)):
        h = c.empty(size)
        token = slices[h.memory.id]
        c.execute(ADD, s.count, bindings(h), U)
        hits = s.stats[0]
        (data,) = await c.read([h])
        assert len(data) == size and (s.stats[0] == hits + 1) is read_taken, s.stats
        await actor_idle(c)  # while h is held: its drop must reach the route, not a batch end
        del h
        hits = s.stats[0]
        h = c.empty(size)
        assert s.stats[0] == hits + 1 and slices[h.memory.id] is token, (size, s.stats)
        del h
    h, g = c.empty(SIZE), c.empty(SIZE)
    await c.read([h])
    c.execute(ADD, s.count, bindings(g), U)  # after the read: not known done
    del g
    assert not taken(s, SIZE)[1]
    await c.sync()
    await c.close()


async def alloc_carried() -> None:
    """A request's second allocation takes the slice its first sent back to the manager
    (pending) with its device address carried over (no lookup at its first use), while
    that slice is still the range it was; otherwise (here: the manager's slice object
    replaced) the address is looked up at its first use, as before."""
    s = await Setup().ready()
    c = s.client
    slices, addresses, mslices = (
        s.server._table._slices,
        s.server._addresses,
        s.server._memory._slices,
    )
    for swap in (False, True):
        x, y = c.empty(SIZE), c.empty(SIZE)
        c.execute(ADD, s.count, bindings(x), U)
        c.execute(ADD, s.count, bindings(y), U)
        await c.read([x])  # the stream is done up to here: both free at once when dropped
        ids = {
            slices[x.memory.id].id: addresses[x.memory.id],
            slices[y.memory.id].id: addresses[y.memory.id],
        }
        del x, y
        hits = s.stats[0]
        a = c.empty(SIZE)  # one of the two slices; the other goes back to the manager
        (other,) = set(ids) - {slices[a.memory.id].id}
        kept = mslices[other]
        if swap:
            mslices[other] = copy.copy(kept)  # another object: not the range recorded
        b = c.empty(SIZE)
        mslices[other] = kept
        assert s.stats[0] == hits + 2 and slices[b.memory.id].id == other, s.stats
        if swap:
            assert b.memory.id not in addresses, "an address carried for another range"
        else:
            assert addresses[b.memory.id] == ids[other], "the address was not carried"
        c.execute(ADD, s.count, bindings(b), U)
        assert addresses[b.memory.id] == ids[other]
        assert len((await c.read([b]))[0]) == SIZE
        del a, b
    await c.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        alloc_taken,
        alloc_declined,
        alloc_passed,
        alloc_other_task,
        alloc_create,
        alloc_errors,
        alloc_after_read,
        alloc_carried,
    )
}


if __name__ == "__main__":
    main(SCENARIOS)
