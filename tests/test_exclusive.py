"""``client.exclusive()`` and ``client.exclusive_call()`` (cubecl's
``ComputeClient::exclusive``): other tasks' commands are held while a block has the
device, without blocking the loop, and released however the block ends. On each device,
under asyncio and trio. Misuse and deadlocks: tests/test_exclusive_misuse.py."""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac

from .kernels import SCALE, SLOW_FILL, blocks

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio

N = 16
OLD, NEW = b"\x01" * N, b"\x02" * N


def _overwrite(client: ac.ComputeClient, h: ac.Handle) -> None:
    client.write([(h.copy_descriptor((N,), (1,), 1), NEW)])


def _scale(client: ac.ComputeClient, h: ac.Handle, n: int, factor: float) -> None:
    bindings = (
        ac.Bindings().with_buffer(h.binding()).with_scalar(np.float32, [factor])
    ).with_scalar(np.uint32, [n])
    client.execute(SCALE, blocks(n), bindings)


class Other:
    """A task started before the block (so outside its scope): on ``go`` it sends its
    commands (``send``), sets ``sent``, then awaits what ``then`` returns into ``got``."""

    def __init__(self, send: Any, then: Any = None) -> None:
        self.go, self.sent, self.done = anyio.Event(), anyio.Event(), anyio.Event()
        self.send, self.then = send, then
        self.got: list[Any] = []

    async def __call__(self) -> None:
        await self.go.wait()
        self.send()
        self.sent.set()
        if self.then is not None:
            self.got.append(await self.then())
        self.done.set()

    async def start(self) -> None:
        """Inside the block: let the task send its commands (they return at once)."""
        self.go.set()
        with anyio.fail_after(5):
            await self.sent.wait()


async def test_writes_and_reads_of_other_tasks_wait_for_the_block(
    client: ac.ComputeClient,
) -> None:
    h = client.create(OLD)
    other = Other(lambda: _overwrite(client, h), lambda: client.read([h]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with client.exclusive():
            await other.start()
            assert await client.read([h]) == [OLD]  # the other task's write is held
            await anyio.sleep(0.02)
            assert other.got == []  # and its read stays pending
        with anyio.fail_after(5):
            await other.done.wait()
    assert other.got == [[NEW]]
    assert await client.read([h]) == [NEW]


async def test_kernels_and_syncs_of_other_tasks_wait_for_the_block(
    client: ac.ComputeClient,
) -> None:
    """The launch and sync routes (the compiled one-call routes on CUDA) hold too."""
    n = 256
    h = client.create(np.ones(n, np.float32))
    other = Other(lambda: _scale(client, h, n, 3.0), client.sync)
    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with client.exclusive():
            await other.start()
            _scale(client, h, n, 2.0)  # the block's own work runs at once
            np.testing.assert_array_equal(await client.read_array(h, np.float32), 2.0)
            await anyio.sleep(0.02)
            assert not other.done.is_set()
        with anyio.fail_after(5):
            await other.done.wait()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), 6.0)


async def test_entering_waits_for_the_work_queued_before(client: ac.ComputeClient) -> None:
    if client.device != "host":
        pytest.skip("reads the host's storage directly (cuda: test_exclusive_misuse.py)")
    h = client.empty(4)
    storage = await client.get_resource(h)
    _slow_fill(client, h, 0.05, 7)
    async with client.exclusive():  # no command inside: the storage itself is done
        assert _bytes(storage) == b"\x07" * 4


def _slow_fill(client: ac.ComputeClient, h: ac.Handle, seconds: float, value: int) -> None:
    bindings = (
        ac.Bindings()
        .with_buffer(h.binding())
        .with_scalar(np.float32, [seconds])
        .with_scalar(np.uint8, [value])
    )
    client.execute(SLOW_FILL, ac.CubeCount(1), bindings)


def _bytes(storage: ac.BindingResource[Any]) -> bytes:
    view = memoryview(storage.resource).cast("B")
    return bytes(view[storage.offset : storage.offset + storage.size])


async def test_tasks_started_inside_the_block_run_as_the_block(
    client: ac.ComputeClient,
) -> None:
    h = client.create(OLD)
    async with client.exclusive():
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: _write_then_read(client, h))
        assert await client.read([h]) == [NEW]


async def _write_then_read(client: ac.ComputeClient, h: ac.Handle) -> None:
    _overwrite(client, h)
    assert await client.read([h]) == [NEW]


async def test_the_loop_runs_while_commands_are_held(client: ac.ComputeClient) -> None:
    h = client.create(OLD)
    other = Other(lambda: _overwrite(client, h), lambda: client.read([h]))
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            await anyio.sleep(0.001)
            ticks += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        tg.start_soon(ticker)
        async with client.exclusive():
            await other.start()
            start = ticks
            await anyio.sleep(0.05)
            assert ticks - start >= 3, "the loop stalled while commands were held"
        stop = True
    assert other.got == [[NEW]]


@pytest.mark.parametrize("how", ["raise", "cancel"])
async def test_the_block_is_released_however_it_ends(client: ac.ComputeClient, how: str) -> None:
    h = client.create(OLD)
    other = Other(lambda: _overwrite(client, h), lambda: client.read([h]))
    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        if how == "raise":
            with pytest.raises(KeyError):
                await _raise_inside(client, other)
        else:
            with anyio.move_on_after(0.05) as scope:
                async with client.exclusive():
                    await other.start()
                    await anyio.sleep(10)
            assert scope.cancelled_caught
        with anyio.fail_after(5):
            await other.done.wait()
    assert other.got == [[NEW]]
    async with client.exclusive():  # the turn was given back
        assert await client.read([h]) == [NEW]


async def _raise_inside(client: ac.ComputeClient, other: Other) -> None:
    async with client.exclusive():
        await other.start()
        raise KeyError("inside")


async def test_blocks_take_turns_in_the_order_they_asked(client: ac.ComputeClient) -> None:
    order: list[str] = []

    async def block(name: str) -> None:
        async with client.exclusive():
            order.append(f"{name} in")
            await anyio.sleep(0.01)
            order.append(f"{name} out")

    async with anyio.create_task_group() as tg:
        for name in "abc":
            tg.start_soon(block, name)
            await anyio.sleep(0.002)
    assert order == ["a in", "a out", "b in", "b out", "c in", "c out"]


async def test_a_task_cancelled_while_waiting_for_its_turn_gives_it_up(
    client: ac.ComputeClient,
) -> None:
    order: list[str] = []
    entered = anyio.Event()

    async def first() -> None:
        async with client.exclusive():
            entered.set()
            await anyio.sleep(0.1)
            order.append("first")

    async def cancelled() -> None:
        with anyio.move_on_after(0.01):
            async with client.exclusive():
                order.append("never")

    async def last() -> None:
        await anyio.sleep(0.002)
        async with client.exclusive():
            order.append("last")

    async with anyio.create_task_group() as tg:
        tg.start_soon(first)
        await entered.wait()
        tg.start_soon(cancelled)
        tg.start_soon(last)
    assert order == ["first", "last"]
    assert client._channel.exclusive_gate is not None
    assert not client._channel.exclusive_gate.waiters


async def test_a_held_task_cancelled_leaks_nothing(client: ac.ComputeClient) -> None:
    """Its awaitable is dropped; its fire-and-forget write still runs after the block
    (as one queued before a cancellation does); the fixture checks no bytes are left."""
    h = client.create(OLD)
    other = Other(lambda: _overwrite(client, h))
    cancelled = anyio.Event()

    async def reader() -> None:
        await other.go.wait()
        with anyio.move_on_after(0.01):
            await client.read([client.create(b"x" * 4096)])
        cancelled.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        tg.start_soon(reader)
        async with client.exclusive():
            await other.start()
            with anyio.fail_after(5):
                await cancelled.wait()
    assert await client.read([h]) == [NEW]


async def test_exclusive_call_runs_off_the_loop_with_the_device_to_itself(
    client: ac.ComputeClient,
) -> None:
    h = client.create(OLD)
    other = Other(lambda: _overwrite(client, h), lambda: client.read([h]))
    in_fn, release = threading.Event(), threading.Event()
    storage = await client.get_resource(h) if client.device == "host" else None
    seen: list[bytes] = []

    def fn(x: int) -> int:
        in_fn.set()
        release.wait(5)
        if storage is not None:  # the host's storage: the held write has not run
            seen.append(_bytes(storage))
        return x + 1

    results: list[int] = []

    async def call() -> None:
        results.append(await client.exclusive_call(fn, 41))

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        tg.start_soon(call)
        with anyio.fail_after(5):
            await anyio.to_thread.run_sync(in_fn.wait)
        await other.start()
        await anyio.sleep(0.02)  # the loop runs while fn does
        assert other.got == []
        release.set()
    assert results == [42]
    assert other.got == [[NEW]]
    assert seen == ([OLD] if storage is not None else [])


async def test_exclusive_call_failure_is_recoverable(client: ac.ComputeClient) -> None:
    """cubecl's exclusive_stays_recoverable_on_task_panic."""

    def boom() -> None:
        raise RuntimeError("exclusive boom")

    with pytest.raises(ac.ExclusiveCallError, match="exclusive boom") as info:
        await client.exclusive_call(boom)
    assert isinstance(info.value.__cause__, RuntimeError)
    assert str(info.value.__cause__) == "exclusive boom"
    assert await client.read([client.create(b"ok")]) == [b"ok"]  # keeps serving
    assert await client.exclusive_call(time.monotonic) > 0  # and a new call works


async def test_a_cancelled_exclusive_call_keeps_the_device_until_fn_returns(
    client: ac.ComputeClient,
) -> None:
    h = client.create(OLD)
    in_fn, release = threading.Event(), threading.Event()

    def fn() -> None:
        in_fn.set()
        release.wait(5)

    async def call() -> None:
        await client.exclusive_call(fn)
        pytest.fail("not cancelled")

    async with anyio.create_task_group() as tg:
        tg.start_soon(call)
        await anyio.to_thread.run_sync(in_fn.wait, 5)
        tg.cancel_scope.cancel()  # while fn runs
    assert in_fn.is_set()
    read = client.read([h])  # held: fn still has the device
    await anyio.sleep(0.02)
    assert not read.done()
    release.set()
    with anyio.fail_after(5):
        assert await read == [OLD]


async def test_cancelled_while_entering_releases(client: ac.ComputeClient) -> None:
    """Cancelled while the work queued before it completes: nothing stays held."""
    if client.device != "host":
        pytest.skip("a host kernel paces the work")
    h = client.empty(4)
    _slow_fill(client, h, 0.1, 7)
    with anyio.move_on_after(0.02) as scope:
        async with client.exclusive():
            pytest.fail("entered before the work queued before it was done")
    assert scope.cancelled_caught
    assert client._channel._exclusive is None
    with anyio.fail_after(5):
        assert await client.read([h]) == [b"\x07" * 4]
