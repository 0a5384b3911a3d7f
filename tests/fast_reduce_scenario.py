"""Scenarios of a whole-tensor ``ac.reduction`` call on a CUDA client (issue 38) on the
real client -> channel -> CudaServer path against the no-op driver of
``benchmarks/bench_overhead.py``: once warm, a call makes two launches, each taken by
the one-call route, and allocates nothing (its stream keeps its partials buffer).

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_reduce_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from asynccube._core.client.memory import ClientMemory
from asynccube._core.cuda.native import _twin_args
from fast_launch_scenario import ACTIVE, Setup, ac, main
from fast_warm_up_scenario import DriverCalls

reduction_module = importlib.import_module("asynccube._core.kernels.reduction")
TOTAL = ac.reduction("sum", name="fr_sum")
CALLS = 10


class Mints:
    """Counts the allocations that take the Python route (``ClientMemory.mint``)."""

    def __init__(self) -> None:
        self.count = 0
        self._mint = ClientMemory.mint

        def mint(memory: Any, *args: Any) -> Any:
            self.count += 1
            return self._mint(memory, *args)

        ClientMemory.mint = mint  # type: ignore[method-assign]

    def stop(self) -> None:
        ClientMemory.mint = self._mint  # type: ignore[method-assign]


class Warmed(Setup):
    """A client on the fake server whose stream has run :data:`TOTAL` (warm)."""

    async def sum_ready(self, n: int = 1 << 20) -> tuple[Any, Any]:
        """A tensor of ``n`` float32 and a result tensor, :data:`TOTAL` warmed on them."""
        await self.ready()
        x = self.client.empty_array((n,), np.float32)
        out = self.client.empty_array((), np.float32)
        TOTAL(self.client, x=x, out=out)  # compiles, loads, checks both kernels' grids
        await self.client.sync()
        TOTAL(self.client, x=x, out=out)
        await self.client.sync()
        return x, out


async def reduce_calls_launch_twice() -> None:
    """Back to back (no sync between), each warm call makes two launches, both taken
    by the one-call route, and no other driver call: no allocation, no command queued.
    (Before: each call allocated its partials; from the second call on, the last one's
    were still in use, so the allocation went through the actor and the launches
    behind it were queued: 10 allocations, about 10 launches left to the route.)"""
    s = Warmed()
    x, out = await s.sum_ready()
    hits, declined = s.stats
    calls, mints = DriverCalls(), Mints()
    twin_driver = _twin_args.state.get("d")
    if ACTIVE != "native":  # the twin calls the driver module it was handed
        _twin_args.state["d"] = calls
    calls.take()
    try:
        for _ in range(CALLS):
            TOTAL(s.client, x=x, out=out)
        counted = calls.take()
    finally:
        calls.stop(), mints.stop()
        _twin_args.state["d"] = twin_driver
    name = "lib:cuLaunchKernel" if ACTIVE == "native" else "cuLaunchKernel"
    assert counted == {name: 2 * CALLS}, counted
    assert mints.count == 0, mints.count
    assert s.stats == (hits + 2 * CALLS, declined), (s.stats, hits, declined)
    assert not s.client._channel._queue  # nothing left for the actor
    await s.client.sync()
    await s.client.close()


async def reduce_partials_per_stream() -> None:
    """Each stream keeps its own partials buffer (never shared across tasks); ``bind``
    (launches run later, perhaps elsewhere) allocates its own each time."""
    s = Warmed()
    x, out = await s.sum_ready()
    kept = s.client._memory.scratch[reduction_module._SCRATCH_KEY]

    async def sum_in_a_task() -> int:
        TOTAL(s.client, x=x, out=out)
        return ac.StreamId.current().value

    here = ac.StreamId.current().value
    mine = kept[here][0]
    other = await asyncio.create_task(sum_in_a_task())
    assert other != here and kept[other][0] is not mine, kept
    TOTAL(s.client, x=x, out=out)
    assert kept[here][0] is mine
    bound = [TOTAL.bind(s.client, x=x, out=out) for _ in range(2)]
    first, second = (call.launches[0].bindings.buffers[-1].memory.id for call in bound)
    assert len({first, second, mine.memory.id}) == 3, (first, second, mine)
    for _ in range(10):  # a task per call (a service's requests): a new stream each
        await asyncio.create_task(sum_in_a_task())
    assert len(kept) == reduction_module._STREAMS_KEPT, kept  # the oldest dropped
    del mine, kept  # only the client keeps them now
    await s.client.sync()
    held = (await s.client.memory_usage()).bytes_in_use
    s.client.memory_cleanup()  # the kept buffers go back with the rest
    assert reduction_module._SCRATCH_KEY not in s.client._memory.scratch
    await s.client.sync()
    after = (await s.client.memory_usage()).bytes_in_use
    assert held - after == reduction_module._STREAMS_KEPT * 8192, (held, after)
    await s.client.close()


async def reduce_failure_not_carried() -> None:
    """A failed call taints its stream's kept partials (the fake driver fails a grid of
    777 blocks): the next call drops that buffer and allocates its own while the
    failure is held, and its result carries nothing; once the failed buffers are gone,
    the stream keeps a new buffer."""
    s = Warmed()
    await s.sum_ready()
    here = ac.StreamId.current().value
    kept = s.client._memory.scratch[reduction_module._SCRATCH_KEY]
    first = kept[here][0]
    first_id = first.memory.id
    bad = s.client.empty_array((777 * 4096,), np.float32)  # 777 partials: fails
    failed = TOTAL(s.client, x=bad)
    try:
        await s.client.sync()
    except ac.DeviceError:
        pass
    else:
        raise AssertionError("the failed launch was not raised")
    held = s.client._channel._held
    assert first.memory.id in held._tainted  # the failure is on the kept buffer
    good = s.client.empty_array((4096,), np.float32)
    out = TOTAL(s.client, x=good)  # the failure is held: its own partials
    assert here not in kept, kept  # the tainted buffer dropped, not kept
    await s.client.read_array(out)  # carries no failure (TaintedBuffer: it would)
    del bad, failed, first
    await s.client.sync()
    assert not held._tainted, held._tainted  # the failure went with its buffers
    TOTAL(s.client, x=good)
    assert kept[here][1].memory.id != first_id  # a new buffer kept
    await s.client.sync()
    await s.client.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (reduce_calls_launch_twice, reduce_partials_per_stream, reduce_failure_not_carried)
}


if __name__ == "__main__":
    main(SCENARIOS)
