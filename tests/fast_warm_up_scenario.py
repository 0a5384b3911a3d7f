"""Scenarios of warm-up runs (issue 40) on the CUDA server's client path, with the no-op
driver of ``benchmarks/bench_overhead.py`` (NVRTC is real: it runs without a GPU): a
warm-up scope compiles and loads a kernel in a worker thread and issues nothing, the
one-call launch route steps aside while the scope is open and takes the first real
launch after it, with no compile and no load left to wait for (an export is not
refused).

Run in its own process by ``tests/test_fast_launch.py`` (as ``fast_launch_scenario.py``,
whose setup it shares); ``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python
twin.
"""

from __future__ import annotations

import asyncio
import ctypes
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import asynccube as ac
from asynccube._core.cuda import driver
from asynccube._core.cuda.native.hotpath import hot
from fast_launch_scenario import ADD, N, Setup, bench_overhead, bench_overhead_lib, main


def fresh() -> ac.Kernel:
    """The add kernel under a new id and source: never compiled in this process."""
    source = bench_overhead.ADD + f"// {uuid.uuid4()}\n"
    return ac.Kernel(f"fl_warm_{uuid.uuid4().hex[:8]}", cuda=ac.CudaSource(source, "add"))


async def warm_up_compiles_and_issues_nothing() -> None:
    """The kernel is compiled and loaded by the scope's end, nothing is issued; the first
    real launch compiles nothing, loads nothing and is issued at the call by the one-call
    route (the warm-up checked its signature and grid), as the next is."""
    s = await Setup().ready()
    kernel, out = fresh(), s.client.empty(4 * N)
    compiles = s.server._compiler.stats.compiles
    stamp = s.stamp()
    async with s.client.warm_up() as stats:
        s.client.execute(kernel, s.count, s.writing_to(out))
        s.client.execute(kernel, s.count, s.writing_to(out))
    assert (stats.launches, stats.kernels, stats.compiled, stats.failed) == (2, 1, 1, 0), stats
    assert s.server._compiler.stats.compiles == compiles + 1  # once for both launches
    assert kernel.id in s.server.loaded_kernels
    assert s.server._loads[0] == s.server._loads[1]  # nothing left loading: exports go
    assert s.stamp() == stamp  # nothing issued
    s.client.write([(out.copy_descriptor((N,), (1,), 4), bytes(4 * N))])  # clears it
    loads, stamp = list(s.server._loads), s.stamp()
    hits, _ = s.stats
    s.client.execute(kernel, s.count, s.writing_to(out))  # the first real launch
    assert s.server._loads == loads  # no load queued: an export now is not refused
    assert s.stamp() != stamp  # issued at the call, behind no job
    assert s.stats[0] == hits + 1, s.stats  # the route's: the warm-up checked it
    s.client.execute(kernel, s.count, s.writing_to(out))
    assert s.stats[0] == hits + 2, s.stats
    assert s.server._compiler.stats.compiles == compiles + 1
    await s.client.sync()
    async with s.client.warm_up() as again:
        s.client.execute(kernel, s.count, s.writing_to(out))
    assert (again.already_loaded, again.compiled) == (1, 0), again
    await s.client.close()


async def warm_up_route_steps_aside() -> None:
    """While a task's scope is open the route declines every launch, and another task's
    (started before the scope) runs through the Python route; one started inside the
    scope is in it (dropped); after the scope the route takes launches again."""
    s = await Setup().ready()
    await s.client.sync()
    opened, inside = asyncio.Event(), []

    async def other_task() -> None:
        await opened.wait()
        stamp = s.stamp()
        s.client.execute(ADD, s.count, s.bindings, ac.ExecutionMode.UNCHECKED)
        inside.append((s.stats, s.stamp() != stamp))

    serving = asyncio.get_running_loop().create_task(other_task())  # outside the scope
    async with s.client.warm_up() as stats:
        before = s.stats
        opened.set()
        await serving
        (during, issued), stamp = inside[0], s.stamp()
        assert during[0] == before[0] and during[1] > before[1], (before, during)
        assert issued  # the other task's launch ran
        started = asyncio.get_running_loop().create_task(other_task())  # inside: dropped
        await started
        assert s.stamp() == stamp and stats.launches == 1, stats
    s.client.execute(ADD, s.count, s.bindings, ac.ExecutionMode.UNCHECKED)  # syncs streams
    hits, _ = s.stats
    s.client.execute(ADD, s.count, s.bindings, ac.ExecutionMode.UNCHECKED)
    assert s.stats[0] == hits + 1, s.stats  # the route is back
    await s.client.sync()
    await s.client.close()


async def warm_up_first_request_takes_the_routes() -> None:
    """A service's handler (create, launch, read) warmed up once at start: the first
    real request is taken whole by the one-call routes (write, launch, read), as the
    hundredth is. The dropped result's buffer is gone with its ``LaunchDropped`` taint
    when the scope ends (while a buffer carries a failure, every route declines), the
    launch's signature and grid were checked by the warm-up (the route takes only
    checked launches), and the read the pass ended on left a spare pinned buffer of its
    size (the read route takes only reads with one; allocating it costs 100s of µs)."""
    s = await Setup().ready()
    kernel, body = fresh(), bytes(4 * N)

    async def handler() -> bytes:
        x = s.client.create(body)
        s.client.execute(kernel, s.count, s.writing_to(x))
        (out,) = await s.client.read([x])
        return bytes(out)

    async with s.client.warm_up() as stats:
        await handler()  # the read raises LaunchDropped: the scope absorbs it
    assert (stats.launches, stats.compiled, stats.failed) == (1, 1, 0), stats
    assert not s.client._channel._held._tainted  # nothing carries a failure any more
    fast = s.client._fast
    (hits, declined), (writes, _) = s.stats, fast.write_stats
    assert await handler() == bytes(4 * N)  # the fake driver copies nothing
    assert s.stats == (hits + 3, declined), s.stats  # the allocation, launch and read
    assert fast.write_stats[0] == writes + 1, fast.write_stats
    await s.client.close()


class DriverCalls:
    """Counts the driver calls by name: ``cuda.bindings``' (the fake module's, wrapped
    while counting) and the compiled hot path's (the fake library's own counters)."""

    def __init__(self) -> None:
        self._module = driver._module
        self._counts: Counter[str] = Counter()
        driver._module = self

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._module, name)
        if not name.startswith("cu") or not callable(attr):
            return attr
        counts = self._counts

        def counted(*args: Any) -> Any:
            counts[name] += 1
            return attr(*args)

        return counted

    def take(self) -> dict[str, int]:
        """The calls since the last take, by name (the library's prefixed ``lib:``)."""
        lib = bench_overhead.c_calls(self._module._lib, reset=True)
        out = {**self._counts, **{f"lib:{k}": v for k, v in lib.items()}}
        self._counts.clear()
        return out

    def stop(self) -> None:
        driver._module = self._module


async def warm_up_first_requests_cost_what_the_hundredth_does() -> None:
    """The device slower than the host, as a GPU is (``fake_pending``: the copy a warm-up
    pass queues is not passed when the pass ends). The scope's end waits for the device
    to pass it (its host function runs here) and collects what that frees: the copy's
    staging, kept as the spare the one-call write takes (no new one is taken from the
    pinned pool), and the dropped buffer's slice.
    The first requests after the scope then make the driver calls the hundredth makes,
    by name and count (no page-locked or device allocation, no retirer poll), each
    taken whole by the one-call routes (allocation, write, launch, read), as the
    hundredth is. (Before: the first took the slow routes, polling the retirer for the
    staging and the slice still held, and the second allocated page-locked memory.)"""
    s = await Setup().ready()
    kernel, body = fresh(), bytes(4 * N)
    pending = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_pending")
    fast = s.client._fast

    async def handler() -> bytes:
        x = s.client.create(body)
        s.client.execute(kernel, s.count, s.writing_to(x))
        (out,) = await s.client.read([x])
        return bytes(out)

    pending.value = 1
    try:
        async with s.client.warm_up():
            await handler()  # the read raises LaunchDropped: the scope absorbs it
    finally:
        pending.value = 0  # (passed by now on a GPU, whatever the scope did)
    # the compiled path's spinning thread may still destroy the event it watched for the
    # scope (its own thread's call, not a request's): let it finish first
    assert hot.notify_drain(5.0)
    calls, requests = DriverCalls(), []
    staging = s.server._write_spare_bytes
    try:
        for _ in range(100):
            calls.take()
            before = (s.stats, fast.write_stats)
            assert await handler() == body  # the fake driver copies nothing
            requests.append((calls.take(), before, (s.stats, fast.write_stats)))
            assert s.server._write_spare_bytes == staging, "a kept spare: none taken anew"
    finally:
        calls.stop()
    hundredth, _, _ = requests[99]
    assert not any("Alloc" in name or "Create" in name for name in hundredth), hundredth
    for i, (made, ((hits, declined), (w_hits, w_declined)), after) in enumerate(requests):
        taken = ((hits + 3, declined), (w_hits + 1, w_declined))
        assert after == taken, f"request {i + 1} took a slow route: {after} != {taken}"
        assert made == hundredth, f"request {i + 1}'s driver calls: {made} != {hundredth}"
    await s.client.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        warm_up_compiles_and_issues_nothing,
        warm_up_route_steps_aside,
        warm_up_first_request_takes_the_routes,
        warm_up_first_requests_cost_what_the_hundredth_does,
    )
}

if __name__ == "__main__":
    main(SCENARIOS)
