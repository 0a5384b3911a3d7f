"""A storm of tasks, a third of them cancelled mid-await and not awaited before the
sync that follows (shared by ``test_memory_after_sync.py`` and its fake-driver
scenario ``sync_memory_scenario.py``)."""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel
import numpy as np

import asynccube as ac

from .kernels import ADD, add_bindings, blocks

N = 256  # float32 elements: 1 KiB per buffer


async def storm_then_usage(
    client: ac.ComputeClient, tasks: int = 300, *, check: bool = True
) -> ac.MemoryUsage:
    """Run the tasks (each creates two buffers, reserves a third and adds them; every
    third one then waits forever, the others await a read of the sum). Once the others
    have ended, the waiting ones are cancelled and, with them not yet awaited, one
    ``await client.sync()`` is followed by ``memory_usage()``, which is returned. The
    garbage collector is off meanwhile: only reference counting frees the handles.
    ``check``: the sums read are checked (not on the no-op driver, which copies none)."""
    scopes = [anyio.CancelScope() for _ in range(tasks)]
    left = [tasks - len(range(0, tasks, 3))]
    ended = anyio.Event()

    async def work(i: int) -> None:
        with scopes[i]:
            a = client.create(np.full(N, i, np.float32))
            await anyio.lowlevel.checkpoint()
            b = client.create(np.arange(N, dtype=np.float32))
            out = client.empty(4 * N)
            client.execute(ADD, blocks(N), add_bindings(a, b, out, N))
            if i % 3 == 0:
                await anyio.sleep_forever()  # cancelled here
            (raw,) = await client.read([out])
            assert not check or (np.frombuffer(raw, np.float32) == i + np.arange(N)).all()
            left[0] -= 1
            if not left[0]:
                ended.set()

    enabled = gc.isenabled()
    gc.disable()
    try:
        async with anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(work, i)
            await ended.wait()
            for scope in scopes[::3]:
                scope.cancel()
            await client.sync()  # the cancelled tasks are not awaited before it
            usage = await client.memory_usage()
        return usage
    finally:
        if enabled:
            gc.enable()


async def cancelled_reads_then_usage(
    client: ac.ComputeClient, tasks: int = 1000, per_step: int = 20, steps: int = 40, seed: int = 37
) -> tuple[int, ac.MemoryUsage]:
    """Issue 37, point 10: ``tasks`` tasks each create two buffers, reserve a third, add
    them and await a read of the sum; ``per_step`` of those not ended yet are cancelled at
    random in each of ``steps`` loop steps, most of them inside the awaited read. Once
    all have ended (under asyncio: ``asyncio.gather(..., return_exceptions=True)``, as
    a user writes it; under trio: a nursery) and a collection, one ``await
    client.sync()``; then ``memory_usage()``, returned with how many were cancelled."""
    rng = random.Random(seed)

    async def work(i: int) -> None:
        a = client.create(np.full(N, i, np.float32))
        b = client.create(np.arange(N, dtype=np.float32))
        out = client.empty(4 * N)
        client.execute(ADD, blocks(N), add_bindings(a, b, out, N))
        (raw,) = await client.read([out])
        assert (np.frombuffer(raw, np.float32) == i + np.arange(N)).all()

    if asyncio._get_running_loop() is not None:  # else trio
        cancelled = await _gathered(work, tasks, per_step, steps, rng)
    else:
        cancelled = await _in_a_task_group(work, tasks, per_step, steps, rng)
    gc.collect()
    await client.sync()
    return cancelled, await client.memory_usage()


async def _gathered(
    work: Callable[[int], Awaitable[None]], n: int, per_step: int, steps: int, rng: random.Random
) -> int:
    tasks = [asyncio.ensure_future(work(i)) for i in range(n)]
    cancelled = 0
    for _ in range(steps):
        await asyncio.sleep(0)
        running = [t for t in tasks if not t.done() and not t.cancelling()]
        for task in rng.sample(running, min(per_step, len(running))):
            task.cancel()
            cancelled += 1
    del running, task
    await asyncio.gather(*tasks, return_exceptions=True)
    return cancelled


async def _in_a_task_group(
    work: Callable[[int], Awaitable[None]], n: int, per_step: int, steps: int, rng: random.Random
) -> int:
    scopes = [anyio.CancelScope() for _ in range(n)]
    done = [False] * n

    async def run(i: int) -> None:
        with scopes[i]:
            await work(i)
        done[i] = True

    cancelled = 0
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(run, i)
        for _ in range(steps):
            await anyio.lowlevel.checkpoint()
            running = [i for i in range(n) if not done[i] and not scopes[i].cancel_called]
            for i in rng.sample(running, min(per_step, len(running))):
                scopes[i].cancel()
                cancelled += 1
    return cancelled
