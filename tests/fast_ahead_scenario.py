"""Scenarios of commands running ahead of other streams' queued commands
(``channel/footprint.py``) on the real client -> channel -> CudaServer path against the
no-op driver of ``benchmarks/bench_overhead.py``: the one-call routes (launch, small
read, allocation) and the tracked Python-route commands of a stream with nothing queued
run at once; those that must wait (their own stream's work, a buffer a queued command
binds, a command of unknown reach queued, an actor awaiting a command) still wait.

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_ahead_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fast_launch_scenario import ADD, N, Setup, U, ac, main

SIZE = 4 * N
A, B, SAME_SLOT_AS_A = 1, 2, 33  # stream ids: device streams 1, 2 and 1 of 32


def bindings(h: ac.Handle) -> ac.Bindings:
    """The add kernel's bindings with ``h`` as every buffer."""
    b = [x.binding() for x in (h, h, h)]
    return ac.Bindings().with_buffers(b).with_scalar(np.uint32, [N])


def spend(s: Setup) -> None:
    """Spend this loop iteration's inline budget: the next Python-route command queues."""
    channel = s.client._channel
    channel._inline_spent = channel.budget


def on(stream: int) -> Any:
    """Run the block's calls on ``stream``."""
    return ac.StreamId.pinned(stream)


def queued(s: Setup) -> tuple[int, int]:
    """(commands queued, tracked commands counted in the footprint)."""
    footprint = s.client._channel.footprint
    assert footprint is not None, "a CUDA client tracks its hot commands"
    return len(s.client._channel._queue), footprint.queued


def prepared(s: Setup) -> tuple[ac.Handle, ac.Handle, Awaitable[Any]]:
    """A buffer on stream A and one on stream B, launched on and read once (so that a
    spare pinned buffer of their size exists for the one-call read), and what to await
    for all of it to have run."""
    with on(A):
        xa = s.client.empty(SIZE)
        s.client.execute(ADD, s.count, bindings(xa), U)
    with on(B):
        xb = s.client.empty(SIZE)
        s.client.execute(ADD, s.count, bindings(xb), U)
        read = s.client.read([xb])
    return xa, xb, asyncio.gather(read, s.client.sync())


_sizes = itertools.count(SIZE + 256, 256)


def queue_on_a(s: Setup, xa: ac.Handle) -> ac.Handle:
    """Stream A's allocation (a size not dropped before: the route's) and a launch over
    ``xa``, queued (the budget spent), tracked; the new handle."""
    spend(s)
    with on(A):
        h = s.client.empty(next(_sizes))  # the route's create, queued
        s.client.execute(ADD, s.count, bindings(xa), U)  # its stream has work queued
    assert queued(s) == (2, 2), queued(s)
    return h


async def ahead_taken() -> None:
    """Stream A's commands queued: stream B's launch, small read and allocation take
    the one-call routes, and B's Python-route command runs inline (budget left), all
    before A's; A's run after, and the counts go back to zero."""
    s = await Setup().ready()
    c = s.client
    xa, xb, done = prepared(s)
    await done
    streams = s.server._streams
    queue_on_a(s, xa)
    cursor_a = streams.streams.get_index(A).cursor
    hits, declined = s.stats
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)
        fut = c.read([xb])
        assert fut.done(), "taken: done before it is awaited"
        c._channel._inline_spent = 0.0
        g = c.empty(SIZE)  # no dropped slice: the route's create, inline ahead of A's
        assert queued(s) == (2, 2), queued(s)
        spend(s)
        h = c.empty(SIZE)  # the budget spent: queued (and B's later commands behind it)
    assert s.stats == (hits + 2, declined + 2), s.stats  # 2 taken; the 2 empties declined
    assert queued(s) == (3, 3), queued(s)
    assert streams.streams.get_index(A).cursor == cursor_a, "A's commands have not run"
    assert g.memory.id in streams.last_use and h.memory.id not in streams.last_use
    assert len(await fut) == 1
    await c.sync()
    footprint = c._channel.footprint
    assert footprint is not None
    assert queued(s) == (0, 0) and not footprint.streams and not footprint.buffers
    assert streams.streams.get_index(A).cursor > cursor_a and h.memory.id in streams.last_use
    await c.close()


async def ahead_declined() -> None:
    """What must wait still waits: the stream's own work queued, a buffer a queued
    command binds (then stream B waits on A's event: it sees A's work), and an actor
    awaiting a command; another stream sharing A's device stream does not wait (its
    launch is issued there before A's queued ones, and stamped so)."""
    s = await Setup().ready()
    c = s.client
    xa, xb, done = prepared(s)
    await done
    with on(SAME_SLOT_AS_A):
        xc = c.empty(SIZE)
        c.execute(ADD, s.count, bindings(xc), U)
    await c.sync()
    queue_on_a(s, xb)  # A's queued launch binds xb, last used on B
    _, declined = s.stats
    with on(A):
        c.execute(ADD, s.count, bindings(xa), U)  # its own stream has work queued
        fut = c.read([xa])
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)  # xb: bound by a queued launch of A
    assert s.stats[1] == declined + 3, s.stats
    assert queued(s) == (5, 5), queued(s)
    hits = s.stats[0]
    with on(SAME_SLOT_AS_A):  # another stream on A's device stream: nothing of its queued
        c.execute(ADD, s.count, bindings(xc), U)
    assert s.stats[0] == hits + 1, s.stats
    cursor = s.server._streams.last_use[xc.memory.id][1]
    await fut
    await c.sync()
    streams = s.server._streams
    assert streams.last_use[xa.memory.id][1] > cursor, "A's queued work issued after it"
    assert streams.last_use[xb.memory.id][0].value == B, "B's launch ran after A's"
    assert streams.streams.get_index(B).last_synced.get(A, -1) >= 1, "B waited on A's work"
    queue_on_a(s, xa)
    c._channel._blocked = True  # as while the actor awaits a command's job (a compile)
    _, declined = s.stats
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)
    assert s.stats[1] == declined + 1, s.stats
    c._channel._blocked = False
    await c.sync()
    await c.close()


async def ahead_untracked() -> None:
    """A queued command of unknown reach (a flush, a sync) keeps every later command
    behind it; so do commands an exclusive block held and queued, and the counts stay
    right."""
    s = await Setup().ready()
    c = s.client
    xa, xb, done = prepared(s)
    await done
    spend(s)
    with on(A):
        c.flush()  # not tracked
    assert queued(s) == (1, 0), queued(s)
    hits, declined = s.stats
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)
        fut = c.read([xb])
        c._channel._inline_spent = 0.0
        c.empty(SIZE)
    assert s.stats == (hits, declined + 3), s.stats
    assert queued(s) == (4, 3), queued(s)
    await fut
    await c.sync()
    assert queued(s) == (0, 0), queued(s)
    spend(s)
    with on(A):
        kept = c.empty(next(_sizes))  # the route's create: queued, tracked
        sync = c.sync()  # then the route's sync: queued, of unknown reach
    _, declined = s.stats
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)
    assert s.stats[1] == declined + 1, s.stats
    assert queued(s) == (3, 2), queued(s)
    await sync
    del kept
    entered, leave = asyncio.Event(), asyncio.Event()

    async def exclusive() -> None:
        async with c.exclusive():
            entered.set()
            await leave.wait()

    task = asyncio.create_task(exclusive())
    await entered.wait()
    with on(A):
        c.execute(ADD, s.count, bindings(xa), U)  # held by the block, then queued
    leave.set()
    await task
    await c.sync()
    assert queued(s) == (0, 0), queued(s)
    await c.close()


async def ahead_read_into() -> None:
    """A queued ``read_into`` (and so ``read_array``) is tracked, as ``read`` is: another
    stream's launch and small read take the one-call routes ahead of it, while a launch
    on its own stream waits behind it."""
    s = await Setup().ready()
    c = s.client
    xa, xb, done = prepared(s)
    await done
    out = np.empty(SIZE, np.uint8)
    spend(s)
    with on(A):
        into = c.read_into(xa, out)
    assert queued(s) == (1, 1), queued(s)
    hits, declined = s.stats
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)
        small = c.read([xb])
    assert s.stats == (hits + 2, declined), s.stats
    with on(A):
        c.execute(ADD, s.count, bindings(xa), U)  # its stream's read is queued
    assert s.stats == (hits + 2, declined + 1), s.stats
    await into
    assert len(await small) == 1
    await c.sync()
    assert queued(s) == (0, 0), queued(s)
    await c.close()


async def ahead_write() -> None:
    """``write`` and ``read_tensor`` are tracked too: stream A's queued write does not
    keep stream B's launch or write waiting, unless B's binds the buffer A writes (then
    it runs after it, and waits for it on the device)."""
    s = await Setup().ready()
    c = s.client
    xa, xb, done = prepared(s)
    await done
    spend(s)
    whole = (SIZE,), (1,), 1
    with on(A):
        c.write([(xa.copy_descriptor(*whole), bytes(SIZE))])  # queued, tracked
        fut = c.read_tensor([xa.copy_descriptor(*whole)])  # behind it, tracked
    assert queued(s) == (2, 2), queued(s)
    hits = s.stats[0]
    c._channel._inline_spent = 0.0
    with on(B):
        c.execute(ADD, s.count, bindings(xb), U)  # taken
        c.write([(xb.copy_descriptor(*whole), bytes(SIZE))])  # inline, ahead of A's
        assert s.stats[0] == hits + 1 and queued(s) == (2, 2), (s.stats, queued(s))
        c.write([(xa.copy_descriptor(*whole), bytes(SIZE))])  # xa: A's queued write binds it
    assert queued(s) == (3, 3), queued(s)
    await fut
    await c.sync()
    streams = s.server._streams
    assert streams.last_use[xa.memory.id][0].value == B, "B's write ran after A's"
    assert streams.streams.get_index(B).last_synced.get(A, -1) >= 1, "B waited on A's work"
    assert queued(s) == (0, 0), queued(s)
    await c.close()


async def ahead_concurrent() -> None:
    """The request as users write it (create, empty, Bindings, execute, await read) in
    64 tasks at once: most of the one-call route offers are taken (each task's stream
    rarely has work queued), where, when any command queued turned every route off,
    almost none were."""
    s = await Setup().ready()
    c = s.client
    body = bytes(SIZE)

    async def requests(n: int) -> None:
        for _ in range(n):
            x, y = c.create(body), c.empty(SIZE)
            b = [x.binding(), x.binding(), y.binding()]
            c.execute(ADD, s.count, ac.Bindings().with_buffers(b).with_scalar(np.uint32, [N]), U)
            (out,) = await c.read([y.binding()])
            assert len(out) == SIZE

    await requests(2)  # a spare pinned buffer for the read, slices of the size
    hits, declined = s.stats
    await asyncio.gather(*(requests(8) for _ in range(64)))
    taken, left = s.stats[0] - hits, s.stats[1] - declined
    assert taken + left == 4 * 64 * 8, (taken, left)
    assert taken >= 0.5 * (taken + left), (taken, left)
    await c.sync()
    assert queued(s) == (0, 0), queued(s)
    await c.close()


async def ahead_records() -> None:
    """A command sent with its stream and buffers gets a ``Tracked`` record only when it
    waits in the queue: run at once (the actor idle, or ahead of other streams' queued
    commands) it gets none."""
    from asynccube._core.channel.footprint import Tracked

    s = await Setup().ready()
    c = s.client
    xa, xb, done = prepared(s)
    await done
    made: list[int] = []
    init = Tracked.__init__

    def counting(self: Tracked, footprint: Any, stream: int, *rest: Any) -> None:
        made.append(stream)
        init(self, footprint, stream, *rest)

    Tracked.__init__ = counting  # type: ignore[method-assign]
    try:
        with on(B):
            c.write([(xb.copy_descriptor((SIZE,), (1,), 1), bytes(SIZE))])  # idle: inline
        assert made == [], made
        queue_on_a(s, xa)  # two commands of A queued: a record each
        assert made == [A, A], made
        with on(B):
            c._channel._inline_spent = 0.0
            c.write([(xb.copy_descriptor((SIZE,), (1,), 1), bytes(SIZE))])  # ahead of A's
        assert made == [A, A] and queued(s) == (2, 2), (made, queued(s))
    finally:
        Tracked.__init__ = init  # type: ignore[method-assign]
    await c.sync()
    assert queued(s) == (0, 0), queued(s)
    await c.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        ahead_taken, ahead_declined, ahead_untracked, ahead_read_into, ahead_write,
        ahead_concurrent, ahead_records,
    )
}  # fmt: skip


if __name__ == "__main__":
    main(SCENARIOS)
