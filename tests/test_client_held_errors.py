"""Errors of fire-and-forget work are held per logical stream (``StreamId``), on each
device of the shared client suite: never per host worker thread, CUDA stream slot or
pool index (issue 10, finding 1)."""

from __future__ import annotations

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.config.config import load_config

from .kernels import ADD, add_bindings, blocks

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio


def _explode(launch: ac.HostLaunch) -> None:
    raise RuntimeError("deliberate failure")


FAIL = ac.Kernel("test_fail_everywhere", host=_explode)
"""Fails on every server: its host part raises; it has no CUDA part (KernelNotSupported)."""


async def test_a_held_error_is_raised_only_on_its_own_stream(client: ac.ComputeClient) -> None:
    # More logical streams than host workers and than the CUDA pool's max_streams: the
    # first half fail, the second half share every worker / slot with a failing one.
    limit = load_config().streaming.max_streams
    count = 2 * limit + 2
    failing = [ac.StreamId(1000 + i) for i in range(count // 2)]
    working = [ac.StreamId(1000 + i) for i in range(count // 2, count)]
    for stream in failing:
        with ac.StreamId.pinned(stream):
            client.execute(FAIL, ac.CubeCount(1), ac.Bindings())  # not awaited
    n = 64
    a = np.arange(n, dtype=np.float32)
    for stream in working:
        with ac.StreamId.pinned(stream):
            ha, out = client.create(a), client.empty(4 * n)
            client.execute(ADD, blocks(n), add_bindings(ha, ha, out, n))
            await client.sync()  # must not receive a failing stream's error
            np.testing.assert_array_equal(await client.read_array(out, np.float32), 2 * a)
    for stream in failing:
        with ac.StreamId.pinned(stream):
            with pytest.raises((ac.ExecutionError, ac.KernelNotSupported)) as info:
                await client.sync()
            assert "test_fail_everywhere" in str(info.value)
            await client.sync()  # raised once, then cleared


async def test_an_unawaited_error_is_raised_by_close_once(device: str) -> None:
    client = await ac.connect(device)
    with ac.StreamId.pinned(ac.StreamId(7)):
        client.execute(FAIL, ac.CubeCount(1), ac.Bindings())
    with ac.StreamId.pinned(ac.StreamId(9)):
        await client.sync()  # another stream: not its error
    with pytest.raises((ac.ExecutionError, ac.KernelNotSupported), match="test_fail_every"):
        await client.close()
