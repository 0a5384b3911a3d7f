"""A storm of tasks, a third of them cancelled mid-await and not awaited before the
sync that follows (shared by ``test_memory_after_sync.py`` and its fake-driver
scenario ``sync_memory_scenario.py``)."""

from __future__ import annotations

import gc

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
