"""The futures of a sync found done at the call (``completion.settle_soon`` and
``one_step_later``, issue 38): awaiting one suspends exactly once under asyncio and
uvloop (the caller wakes in the next loop iteration, behind the wake-ups queued before
it), one nobody awaits is settled by its backstop (and still warns when dropped
unawaited), and under trio they keep settling from a callback."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Coroutine
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.channel.completion import (
    LaterFuture,
    later_futures,
    one_step_later,
    settle_soon,
)
from asynccube._core.testing.ticks import loop_ticks

from .kernels import SCALE, blocks


async def _iterations(make: Callable[[], asyncio.Future[Any]]) -> tuple[int, Any]:
    """Loop iterations an ``await make()`` took, and what it gave (or raised)."""
    count, stop = loop_ticks()
    before = count[0]
    try:
        value: Any = await make()
    except Exception as exc:
        value = exc
    woke = count[0] - before
    stop()
    await asyncio.sleep(0)
    return woke, value


def _done_future(value: Any = None, error: BaseException | None = None) -> asyncio.Future[Any]:
    fut = asyncio.get_running_loop().create_future()
    if error is None:
        fut.set_result(value)
    else:
        fut.set_exception(error)
    return fut


async def _wake_once(host: ac.ComputeClient) -> None:
    make = later_futures(host._channel)
    assert type(make()) is LaterFuture
    woke, value = await _iterations(lambda: settle_soon(make()))
    assert (woke, value) == (1, None)
    woke, value = await _iterations(lambda: one_step_later(make, _done_future(7)))
    assert (woke, value) == (1, 7)
    woke, value = await _iterations(
        lambda: one_step_later(make, _done_future(error=ac.InvalidArgument("bad")))
    )
    assert woke == 1 and isinstance(value, ac.InvalidArgument), value


@pytest.mark.asyncio
async def test_awaiting_suspends_exactly_once(host_client: ac.ComputeClient) -> None:
    await _wake_once(host_client)


def _under_uvloop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    uvloop = pytest.importorskip("uvloop")
    uvloop.run(main())


def test_awaiting_suspends_exactly_once_under_uvloop() -> None:
    async def main() -> None:
        async with ac.open_client("host") as host:
            await _wake_once(host)

    _under_uvloop(main)


@pytest.mark.asyncio
async def test_tasks_cancelled_before_it_have_ended_when_it_returns(
    host_client: ac.ComputeClient,
) -> None:
    make = later_futures(host_client._channel)
    blocked = [asyncio.ensure_future(asyncio.sleep(3600)) for _ in range(5)]
    await asyncio.sleep(0)
    for task in blocked:
        task.cancel()
    await settle_soon(make())
    assert all(task.cancelled() for task in blocked)


@pytest.mark.asyncio
async def test_one_nobody_awaits_is_settled_by_its_backstop(
    host_client: ac.ComputeClient,
) -> None:
    make = later_futures(host_client._channel)
    sync, relayed = settle_soon(make()), one_step_later(make, _done_future("v"))
    assert not sync.done() and not relayed.done()  # never at once
    await asyncio.sleep(0)
    assert sync.done() and relayed.done()
    assert sync.exception() is None and relayed.exception() is None  # (seen: no warning)
    assert relayed.result() == "v"
    assert sync._ac_source is None and relayed._ac_source is None  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_one_dropped_unawaited_still_warns(host_client: ac.ComputeClient) -> None:
    make = later_futures(host_client._channel)
    fut = settle_soon(make())
    await asyncio.sleep(0)
    with pytest.warns(RuntimeWarning, match="was never awaited"):
        del fut  # (reference counting drops it here)
    gc.collect()


@pytest.mark.asyncio
async def test_cancelled_before_it_is_awaited(host_client: ac.ComputeClient) -> None:
    make = later_futures(host_client._channel)
    fut = settle_soon(make())
    fut.cancel()
    with pytest.raises(asyncio.CancelledError):
        await fut
    await asyncio.sleep(0)  # the backstop leaves it as it is
    assert fut.cancelled()


@pytest.mark.asyncio
async def test_gathered_and_waited(host_client: ac.ComputeClient) -> None:
    make = later_futures(host_client._channel)
    got = await asyncio.gather(settle_soon(make()), one_step_later(make, _done_future(2)))
    assert got == [None, 2]
    done, _ = await asyncio.wait([settle_soon(make())], timeout=5)
    assert len(done) == 1 and done.pop().result() is None


def test_under_trio_it_still_settles_from_a_callback() -> None:
    trio = pytest.importorskip("trio")

    async def main() -> None:
        async with ac.open_client("host") as host:
            make = later_futures(host._channel)
            fut = settle_soon(make())
            assert type(fut) is not LaterFuture and not fut.done()
            assert await fut is None
            assert await one_step_later(make, fut) is None
            await host.sync()

    trio.run(main)


@pytest.mark.cuda
@pytest.mark.asyncio
async def test_a_sync_the_gpu_is_done_with_wakes_in_the_next_loop_iteration() -> None:
    """``execute`` of a tiny kernel, then ``await sync()``: one loop iteration (FastSync's
    future settles as the task suspends), not two."""
    async with ac.open_client("cuda:0") as gpu:
        await _sync_after_a_tiny_kernel(gpu)


async def _sync_after_a_tiny_kernel(gpu: ac.ComputeClient) -> None:
    h = gpu.create(np.ones(256, np.float32))
    bindings = ac.Bindings().with_buffer(h.binding()).with_scalar(np.float32, [2.0])
    bindings = bindings.with_scalar(np.uint32, [256])
    gpu.execute(SCALE, blocks(256), bindings)
    await gpu.sync()
    hits = gpu._fast_sync.hits
    count, stop = loop_ticks()
    woke = []
    for _ in range(20):
        gpu.execute(SCALE, blocks(256), bindings)
        before = count[0]
        await gpu.sync()
        woke.append(count[0] - before)
    stop()
    await asyncio.sleep(0)
    taken = gpu._fast_sync.hits - hits
    assert taken >= 15 and woke.count(1) >= taken, (taken, woke)
    assert min(woke) >= 1
