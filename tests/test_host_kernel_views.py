"""A host kernel's views are valid only during its launch (issue 28, point 6): one kept
past the launch fails the launch, turns read-only, and its memory is never handed to a
later buffer while it lives, so nothing else can be corrupted through it."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

import asynccube as ac

pytestmark = pytest.mark.asyncio

N = 1024
ONE = ac.CubeCount(1)


def _keeper(kept: list[Any], what: str) -> ac.Kernel:
    """A kernel that writes 1.0 into its buffer and keeps ``what`` of its launch."""

    def host(launch: ac.HostLaunch) -> None:
        out = launch.buffers[0].view(np.float32)
        out[:] = 1.0
        kept.append({"view": launch.buffers[0], "derived": out, "launch": launch}[what])

    return ac.Kernel(f"test_keeps_{what}", host=host)


@pytest.mark.parametrize(
    ("what", "named"),
    [("view", r"launch\.buffers\[0\]"), ("derived", r"launch\.buffers\[0\]"),
     ("launch", "the launch")],
)  # fmt: skip
async def test_a_kept_view_fails_the_launch_and_corrupts_nothing(
    host_client: ac.ComputeClient, what: str, named: str
) -> None:
    c = host_client
    kept: list[Any] = []
    h = c.empty(4 * N)
    c.execute(_keeper(kept, what), ONE, ac.Bindings().with_buffers([h]))
    with pytest.raises(ac.ExecutionError, match=f"kept {named}.*valid only during its launch"):
        await c.sync()
    with pytest.raises(ac.TaintedBuffer, match=f"kept {named}"):
        await c.read_array(h, np.float32)  # a failed launch's buffer is tainted
    del h
    await c.sync()
    # The slice stays reserved while the kept view lives: new buffers of the same size
    # never share its memory, so a write through the kept view reaches none of them.
    later = [c.create(np.full(N, 7.0, np.float32)) for _ in range(8)]
    await c.sync()
    given = kept[0].buffers[0] if what == "launch" else kept[0]
    if what == "derived":
        given[:] = 99.0  # a view derived in the kernel stays writable (numpy cannot revoke)
    else:
        with pytest.raises(ValueError, match="read-only"):
            given[:] = 99  # the view the kernel was given is read-only now
        given.flags.writeable = True  # made writable on purpose: still nothing shared
        given[:] = 99
    for handle in later:
        np.testing.assert_array_equal(await c.read_array(handle, np.float32), 7.0)
    assert (await c.memory_usage()).bytes_in_use >= 4 * N * 9
    del later, given, handle
    kept.clear()  # the last kept view gone: its buffer goes back to the pool
    await c.sync()
    assert (await c.memory_usage()).bytes_in_use == 0


async def test_a_view_kept_by_a_failing_kernel_corrupts_nothing(
    host_client: ac.ComputeClient,
) -> None:
    c = host_client
    kept: list[Any] = []

    def host(launch: ac.HostLaunch) -> None:
        kept.append(launch.buffers[0].view(np.float32))
        raise RuntimeError("boom")

    h = c.empty(4 * N)
    c.execute(ac.Kernel("test_keeps_and_fails", host=host), ONE, ac.Bindings().with_buffers([h]))
    with pytest.raises(ac.ExecutionError, match="boom"):
        await c.sync()  # the kernel's own error; its buffer stays reserved
    del h
    gc.collect()  # the error and its traceback gone: only the kept view holds the buffer
    await c.sync()
    later = [c.create(np.full(N, 7.0, np.float32)) for _ in range(8)]
    await c.sync()
    kept[0][:] = 99.0
    for handle in later:
        np.testing.assert_array_equal(await c.read_array(handle, np.float32), 7.0)
    del later, handle
    kept.clear()
    gc.collect()  # the failed kernel's traceback is in a cycle with its error (point 11)
    await c.sync()
    assert (await c.memory_usage()).bytes_in_use == 0


async def test_a_kernel_that_keeps_nothing_is_not_flagged(host_client: ac.ComputeClient) -> None:
    seen: list[float] = []

    def host(launch: ac.HostLaunch) -> None:
        a, b = (buf.view(np.float32) for buf in launch.buffers)
        total = a[:4].copy()  # copies may outlive the launch
        b[:] = a * 2
        seen.append(float(total.sum()))
        gc.collect()  # nothing of the launch is garbage waiting to be collected

    k = ac.Kernel("test_keeps_nothing", host=host)
    a, b = host_client.create(np.ones(N, np.float32)), host_client.empty(4 * N)
    for _ in range(3):
        host_client.execute(k, ONE, ac.Bindings().with_buffers([a, b.binding()]))
    np.testing.assert_array_equal(await host_client.read_array(b, np.float32), 2.0)
    assert seen == [4.0, 4.0, 4.0]
