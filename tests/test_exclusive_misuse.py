"""Misusing ``client.exclusive()`` and ``client.exclusive_call()`` raises typed errors,
never hangs: nesting, commands that would wait for themselves (from the callable, or
held commands awaited from inside the block), a closed client; closing inside a block;
and the GPU check with a foreign library (torch) working inside the block."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac

from .kernels import SCALE, blocks

N = 16
OLD, NEW = b"\x01" * N, b"\x02" * N


def _overwrite(client: ac.ComputeClient, h: ac.Handle) -> None:
    client.write([(h.copy_descriptor((N,), (1,), 1), NEW)])


@pytest.mark.anyio
async def test_nesting_in_the_same_task_raises(client: ac.ComputeClient) -> None:
    h = client.create(OLD)
    async with client.exclusive():
        with pytest.raises(ac.ExclusiveAccessError, match="inside an exclusive block"):
            async with client.exclusive():
                pytest.fail("entered a nested block")
        with pytest.raises(ac.ExclusiveAccessError, match="inside an exclusive block"):
            await client.exclusive_call(lambda: None)
        _overwrite(client, h)  # the block goes on
        assert await client.read([h]) == [NEW]
    async with client.exclusive():
        pass


@pytest.mark.anyio
async def test_a_task_started_inside_the_block_cannot_enter_another(
    client: ac.ComputeClient,
) -> None:
    errors: list[BaseException] = []

    async def child() -> None:
        try:
            async with client.exclusive():
                pytest.fail("a task of the block entered a block of its own")
        except ac.ExclusiveAccessError as exc:
            errors.append(exc)

    async with client.exclusive(), anyio.create_task_group() as tg:
        tg.start_soon(child)
    assert len(errors) == 1


@pytest.mark.anyio
async def test_a_closed_client_raises(device: str) -> None:
    c = await ac.connect(device)
    await c.close()
    with pytest.raises(ac.ClientClosedError):
        async with c.exclusive():
            pytest.fail("entered on a closed client")
    with pytest.raises(ac.ClientClosedError):
        await c.exclusive_call(lambda: None)


@pytest.mark.anyio
async def test_exclusive_call_needs_a_callable(client: ac.ComputeClient) -> None:
    with pytest.raises(ac.InvalidArgument, match="needs a callable"):
        await client.exclusive_call(42)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_the_callable_calling_the_client_raises(client: ac.ComputeClient) -> None:
    """From its thread: LoopMismatchError; through the loop (a coroutine it schedules
    there): ExclusiveAccessError, not a hang. Both come back as ExclusiveCallError."""
    h = client.create(OLD)
    backend = client._channel.backend.name
    loop = client.loop

    async def read() -> list[bytes]:
        return await client.read([h])

    def through_loop() -> Any:
        if backend == "asyncio":
            return asyncio.run_coroutine_threadsafe(read(), loop).result(5)
        import trio

        return trio.from_thread.run(read, trio_token=loop.token)  # type: ignore[attr-defined]

    with anyio.fail_after(10):
        with pytest.raises(ac.ExclusiveCallError) as info:
            await client.exclusive_call(lambda: client.read([h]))
        assert isinstance(info.value.__cause__, ac.LoopMismatchError)
        with pytest.raises(ac.ExclusiveCallError, match="ExclusiveAccessError") as info:
            await client.exclusive_call(through_loop)
        assert isinstance(info.value.__cause__, ac.ExclusiveAccessError)
        assert "read() was called from inside the callable" in str(info.value.__cause__)
    assert await client.read([h]) == [OLD]


@pytest.mark.anyio
async def test_the_callable_closing_the_client_raises(device: str) -> None:
    """close() does not check the scope first: its held close is what it would wait
    for; the client closes after the block."""
    c = await ac.connect(device)
    backend = c._channel.backend.name
    loop = c.loop

    def close() -> None:
        if backend == "asyncio":
            asyncio.run_coroutine_threadsafe(c.close(), loop).result(5)
        else:
            import trio

            trio.from_thread.run(c.close, trio_token=loop.token)  # type: ignore[attr-defined]

    with anyio.fail_after(10), pytest.raises(ac.ExclusiveCallError) as info:
        await c.exclusive_call(close)
    assert isinstance(info.value.__cause__, ac.ExclusiveAccessError)
    await c.close()
    assert c.closed


@pytest.mark.anyio
async def test_awaiting_a_held_awaitable_from_the_block_raises(
    client: ac.ComputeClient,
) -> None:
    """Another task's read, held by the block, awaited by the block: it would settle
    after the block ends, which waits for it."""
    h = client.create(OLD)
    go, made = anyio.Event(), anyio.Event()
    reads: list[Any] = []

    async def other() -> None:
        await go.wait()
        reads.append(client.read([h]))
        made.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with client.exclusive():
            go.set()
            await made.wait()
            with anyio.fail_after(5), pytest.raises(ac.ExclusiveAccessError, match="deadlock"):
                await reads[0]
    assert await client.read([h]) == [OLD]


@pytest.mark.anyio
async def test_closing_inside_the_block_runs_what_it_held_first(device: str) -> None:
    c = await ac.connect(device)
    h = c.create(OLD)
    go, sent = anyio.Event(), anyio.Event()
    got: list[Any] = []

    async def other() -> None:
        await go.wait()
        _overwrite(c, h)
        read = c.read([h])
        sent.set()
        got.append(await read)

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with c.exclusive():
            go.set()
            await sent.wait()
            with anyio.fail_after(5):
                await c.close()
    assert got == [[NEW]]


@pytest.mark.anyio
async def test_another_task_closing_waits_for_the_block(device: str) -> None:
    c2 = await ac.connect(device)
    go = anyio.Event()
    order: list[str] = []

    async def late_closer() -> None:
        await go.wait()
        await c2.close()
        order.append("closed")

    async with anyio.create_task_group() as tg:
        tg.start_soon(late_closer)
        async with c2.exclusive():
            go.set()
            await anyio.sleep(0.02)
            assert order == []  # its close is held until the block ends
            with pytest.raises(ac.ClientClosedError):  # but refuses new commands at once
                c2.create(b"late")
            order.append("block")
    assert order == ["block", "closed"]


@pytest.mark.anyio
async def test_a_dlpack_export_from_another_task_is_refused(client: ac.ComputeClient) -> None:
    if client.device != "host":
        pytest.skip("a host tensor exported to numpy")
    t = client.create_array(np.arange(4, dtype=np.float32))
    go, done = anyio.Event(), anyio.Event()
    errors: list[BaseException] = []

    async def other() -> None:
        await go.wait()
        try:
            np.from_dlpack(t)
        except ac.DLPackError as exc:
            errors.append(exc)
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(other)
        async with client.exclusive():
            go.set()
            await done.wait()
            np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4))  # its own
    assert len(errors) == 1 and "exclusive" in str(errors[0])
    np.testing.assert_array_equal(np.from_dlpack(t), np.arange(4))


# -- asyncio: tasks awaited from the block ---------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("how", ["task", "gather", "wait_for"])
async def test_awaiting_a_task_whose_command_is_held_raises(
    host_client: ac.ComputeClient, how: str
) -> None:
    client = host_client
    h = client.create(OLD)
    go = asyncio.Event()

    async def reader() -> list[bytes]:
        await go.wait()
        return await client.read([h])

    task = asyncio.create_task(reader())  # before the block: not its own
    await asyncio.sleep(0)
    async with client.exclusive():
        go.set()
        waiting = {"task": task, "gather": asyncio.gather(task)}.get(how)
        with pytest.raises(ac.ExclusiveAccessError, match="deadlock") as info:
            await asyncio.wait_for(waiting or asyncio.wait_for(task, 10), 5)
        assert task.get_name() in str(info.value)
    assert await client.read([h]) == [OLD]


@pytest.mark.asyncio
async def test_awaiting_a_task_waiting_for_its_turn_raises(
    host_client: ac.ComputeClient,
) -> None:
    client = host_client
    go = asyncio.Event()

    async def waiter() -> None:
        await go.wait()
        async with client.exclusive():
            pytest.fail("entered while the block waited for it")

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)
    async with client.exclusive():
        go.set()
        with pytest.raises(ac.ExclusiveAccessError, match="waiting to enter"):
            async with asyncio.timeout(5):
                await task
    assert client._channel.exclusive_gate is not None
    assert not client._channel.exclusive_gate.waiters
    async with client.exclusive():
        pass


@pytest.mark.asyncio
async def test_a_waiting_block_does_not_stall_the_loop(host_client: ac.ComputeClient) -> None:
    from .lagprobe import MAX_LAG_SECONDS, LoopLagProbe

    client = host_client
    probe = LoopLagProbe()
    probe.start()
    release = threading.Event()
    call = asyncio.create_task(client.exclusive_call(release.wait, 5))
    await asyncio.sleep(0.01)
    h = client.create(b"x")
    reads: list[asyncio.Future[list[bytes]]] = []

    async def reader() -> None:  # a task of its own per read: each is looked at
        fut = client.read([h])
        reads.append(fut)
        await fut

    tasks = []
    for _ in range(20):  # 2000 held reads, awaited by 2000 tasks
        tasks += [asyncio.create_task(reader()) for _ in range(100)]
        await asyncio.sleep(0)
    await asyncio.sleep(0.05)  # several looks at them all
    assert len(reads) == 2000 and not any(r.done() for r in reads)
    block = client._channel._exclusive  # one look is bounded (2000 walks: ~10 ms)
    assert block is not None and block._timer is not None
    block._timer.cancel()
    block._timer = None
    start = time.thread_time()  # CPU time: a loaded host's preemption is not the look's
    block._look()
    assert time.thread_time() - start < 0.004
    release.set()
    assert await call is True
    await asyncio.gather(*tasks)
    assert {tuple(r.result()) for r in reads} == {(b"x",)}
    assert await probe.stop() <= MAX_LAG_SECONDS, probe.culprit


# -- GPU: a foreign library inside the block --------------------------------------------


@pytest.mark.cuda
def test_torch_inside_the_block_sees_no_held_kernel() -> None:
    """torch reads the client's buffer inside the block (through DLPack) while another
    task's kernel that scales it is held: it sees the bytes before that kernel; after
    the block the kernel has run."""
    torch = pytest.importorskip("torch")

    async def main() -> None:
        async with ac.open_client("cuda:0") as client:
            n = 1 << 16
            x = client.create_array(np.ones(n, np.float32))
            go, sent = asyncio.Event(), asyncio.Event()

            async def other() -> None:
                await go.wait()
                for _ in range(8):
                    bindings = (
                        ac.Bindings()
                        .with_buffer(x.handle.binding())
                        .with_scalar(np.float32, [2.0])
                        .with_scalar(np.uint32, [n])
                    )
                    client.execute(SCALE, blocks(n), bindings)
                sent.set()
                await client.sync()

            task = asyncio.create_task(other())
            await asyncio.sleep(0)
            async with client.exclusive():
                go.set()
                await sent.wait()
                seen = torch.from_dlpack(x)
                total = float((seen * 1).sum())  # torch's own kernels, then a sync
                torch.cuda.synchronize()
                assert total == n, "another task's kernel ran inside the block"
            await task
            np.testing.assert_array_equal(await client.read_array(x), np.full(n, 256.0))

    asyncio.run(main())
