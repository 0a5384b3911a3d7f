"""Scenarios of ``client.exclusive()`` against the servers' one-call routes (launch,
read, sync: ``cuda/fast.py``, ``cuda/fast_sync.py``), on the real client -> channel ->
CudaServer path with the no-op driver of ``benchmarks/bench_overhead.py``.

Run in its own process by ``tests/test_fast_launch.py`` (as ``fast_launch_scenario.py``,
whose setup it shares); ``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python
twin.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from fast_launch_scenario import ADD, Setup, U, main


async def exclusive_held() -> None:
    """While a block is active, the routes decline another task's launch, read and
    sync, which are held (not issued) until the block ends; then the routes take them
    again."""
    s = await Setup().ready()
    h = s.handles[2]
    await s.client.read([h])  # the read route keeps a spare buffer of this size
    go, sent = asyncio.Event(), asyncio.Event()
    fast_sync = s.client._fast_sync

    async def other() -> None:
        await go.wait()
        s.client.execute(ADD, s.count, s.bindings, U)
        read = s.client.read([h])
        sync = s.client.sync()
        sent.set()
        await read
        await sync

    task = asyncio.create_task(other())
    await asyncio.sleep(0)
    before = s.stamp(2)
    hits, declined = s.stats
    sync_hits = fast_sync.hits
    async with s.client.exclusive():
        go.set()
        await sent.wait()
        await asyncio.sleep(0.01)
        assert not task.done(), "another task's read or sync ran inside the block"
        assert s.stamp(2) == before, "another task's launch was issued inside the block"
        assert s.stats[0] == hits, s.stats  # nothing taken by the routes meanwhile
        assert s.stats[1] > declined, s.stats
        assert fast_sync.hits == sync_hits
    await asyncio.wait_for(task, 5)
    assert s.stamp(2) != before, "the held launch ran after the block"
    assert s.client._channel.guard is None
    s.client.execute(ADD, s.count, s.bindings, U)  # last used on the other task's stream
    hits, _ = s.stats
    s.client.execute(ADD, s.count, s.bindings, U)
    assert s.stats[0] == hits + 1, s.stats  # the route takes launches again
    await s.client.sync()
    await s.client.close()


async def exclusive_own() -> None:
    """The block's own launches, reads and syncs run (through the Python route)."""
    s = await Setup().ready()
    h = s.handles[2]
    before = s.stamp(2)
    async with s.client.exclusive():
        s.client.execute(ADD, s.count, s.bindings, U)
        assert s.stamp(2) != before, "the block's own launch was not issued at once"
        assert len((await s.client.read([h]))[0]) == len(bytes(h.size))
        await s.client.sync()
    await s.client.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    "exclusive_held": exclusive_held,
    "exclusive_own": exclusive_own,
}


if __name__ == "__main__":
    main(SCENARIOS)
