"""The channel: batching actor, held errors, close, death, loops and threads."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, NOOP, SLOW_FILL, add_bindings, blocks

pytestmark = pytest.mark.asyncio


def _failing_kernel() -> ac.Kernel:
    def boom(launch: ac.HostLaunch) -> None:
        raise RuntimeError("kernel exploded")

    return ac.Kernel("boom", host=boom)


async def test_fire_and_forget_error_raised_at_next_await_on_that_stream(
    host_client: ac.ComputeClient,
) -> None:
    host_client.execute(_failing_kernel(), ac.CubeCount(1), ac.Bindings())

    async def other_stream() -> None:
        await host_client.sync()  # another task, another stream: not its error

    await asyncio.create_task(other_stream())
    with pytest.raises(ac.ExecutionError, match="kernel exploded"):
        await host_client.sync()
    await host_client.sync()  # raised once, then cleared


async def test_two_errors_are_reported_together(host_client: ac.ComputeClient) -> None:
    host_client.execute(_failing_kernel(), ac.CubeCount(1), ac.Bindings())
    host_client.execute(_failing_kernel(), ac.CubeCount(1), ac.Bindings())
    with pytest.raises(ac.ExecutionError) as info:
        await host_client.sync()
    assert any("also failed" in n for n in info.value.__notes__)


async def test_100_concurrent_tasks_match_numpy(host_client: ac.ComputeClient) -> None:
    rng = np.random.default_rng(0)

    async def work(i: int) -> None:
        n = 64 + i
        a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
        ha, hb, out = host_client.create(a), host_client.create(b), host_client.empty(4 * n)
        host_client.execute(ADD, blocks(n), add_bindings(ha, hb, out, n))
        np.testing.assert_array_equal(await host_client.read_array(out, np.float32), a + b)

    await asyncio.gather(*(work(i) for i in range(100)))


async def test_commands_are_batched(host_client: ac.ComputeClient) -> None:
    # 500 commands, queued 100 per loop step: 500 in one step of the test's own task
    # take ~3 ms on an idle machine (~6 us each), near the probe's 5 ms on a loaded one.
    for i in range(500):
        host_client.execute(NOOP, ac.CubeCount(1), ac.Bindings())
        if i % 100 == 99:
            await asyncio.sleep(0)
    await host_client.sync()
    usage = await host_client.memory_usage()
    assert usage.number_allocs == 0


async def test_cancelled_read_leaves_client_usable_and_leaks_nothing(
    host_client: ac.ComputeClient,
) -> None:
    baseline = await host_client.memory_usage()
    slow = host_client.empty(1024)
    host_client.execute(
        SLOW_FILL,
        ac.CubeCount(1),
        ac.Bindings().with_buffer(slow).with_scalar(np.float32, [0.05]).with_scalar(np.uint8, [7]),
    )

    async def reader(handle: ac.Handle) -> list[bytes]:
        return await host_client.read([handle])

    task = asyncio.create_task(reader(slow))
    await asyncio.sleep(0.005)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await host_client.read([slow]) == [bytes([7]) * 1024]
    # The cancelled task keeps its CancelledError, whose traceback holds the reader's
    # frame and so the handle: the caller's own reference, dropped here with the task.
    del task, slow
    gc.collect()
    await host_client.sync()
    host_client.memory_cleanup()
    after = await host_client.memory_usage()
    assert after.bytes_in_use == baseline.bytes_in_use
    assert after.number_allocs == baseline.number_allocs


async def test_future_returned_before_await_keeps_order(host_client: ac.ComputeClient) -> None:
    h = host_client.create(b"aaaa")
    first = host_client.read([h])
    host_client.write([(h.copy_descriptor((4,), (1,), 1), b"bbbb")])
    second = host_client.read([h])
    assert await first == [b"aaaa"]
    assert await second == [b"bbbb"]


async def test_close_finishes_queued_work() -> None:
    client = await ac.connect("host")
    out = client.empty(8)
    client.execute(
        SLOW_FILL,
        ac.CubeCount(1),
        ac.Bindings().with_buffer(out).with_scalar(np.float32, [0.02]).with_scalar(np.uint8, [9]),
    )
    pending = client.read([out])
    await client.close()
    assert await pending == [bytes([9]) * 8]


async def test_close_raises_unobserved_errors() -> None:
    client = await ac.connect("host")
    client.execute(_failing_kernel(), ac.CubeCount(1), ac.Bindings())
    with pytest.raises(ac.ExecutionError, match="kernel exploded"):
        await client.close()
    assert client.closed


async def test_open_client_context_closes() -> None:
    async with ac.open_client("host") as client:
        h = client.create(b"abc")
        assert await client.read([h]) == [b"abc"]
    assert client.closed
    with pytest.raises(ac.ClientClosedError):
        client.empty(1)


async def test_actor_death_fails_pending_and_later_awaitables() -> None:
    client = await ac.connect("host")
    slow = client.empty(8)
    client.execute(
        SLOW_FILL,
        ac.CubeCount(1),
        ac.Bindings().with_buffer(slow).with_scalar(np.float32, [0.05]).with_scalar(np.uint8, [1]),
    )
    pending = client.read([slow])
    client._channel.kill_for_test(RuntimeError("actor bug"))
    queued_after = client.sync()
    with pytest.raises(ac.ClientDeadError, match="actor bug"):
        await asyncio.wait_for(pending, 2)
    with pytest.raises(ac.ClientDeadError):
        await asyncio.wait_for(queued_after, 2)
    with pytest.raises(ac.ClientDeadError):
        client.read([slow])
    await client.close()  # closing a dead client does not hang or raise


async def test_settled_and_cancelled_awaitables_are_not_kept(
    host_client: ac.ComputeClient,
) -> None:
    """The channel forgets each awaitable as it settles it (no done-callback per
    command), and awaitables their callers cancelled stay bounded until pruned."""
    channel = host_client._channel
    for _ in range(10):
        await host_client.sync()
    assert not channel._pending
    slow = host_client.empty(8)
    host_client.execute(
        SLOW_FILL,
        ac.CubeCount(1),
        ac.Bindings().with_buffer(slow).with_scalar(np.float32, [0.02]).with_scalar(np.uint8, [1]),
    )
    for _ in range(6):
        for _ in range(200):
            host_client.sync().cancel()
        await asyncio.sleep(0)  # keep each loop step short (the loop-lag probe)
    assert len(channel._pending) <= 2 * 256
    await host_client.sync()
    assert not channel._pending


async def test_call_from_another_thread_is_refused(host_client: ac.ComputeClient) -> None:
    errors: list[BaseException] = []

    def from_thread() -> None:
        try:
            host_client.empty(8)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=from_thread)
    thread.start()
    await asyncio.get_running_loop().run_in_executor(None, thread.join)
    assert len(errors) == 1 and isinstance(errors[0], ac.LoopMismatchError)
    assert "run_coroutine_threadsafe" in str(errors[0])
    # Issue 37, point 18: the usual caller is a web framework's sync endpoint.
    assert "make the handler `async def`" in str(errors[0])


async def test_another_thread_can_route_through_run_coroutine_threadsafe(
    host_client: ac.ComputeClient,
) -> None:
    async def job() -> list[bytes]:
        return await host_client.read([host_client.create(b"routed")])

    def from_thread() -> list[bytes]:
        return asyncio.run_coroutine_threadsafe(job(), host_client.loop).result(5)

    result = await asyncio.get_running_loop().run_in_executor(None, from_thread)
    assert result == [b"routed"]


async def test_call_from_another_event_loop_is_refused(host_client: ac.ComputeClient) -> None:
    async def in_other_loop() -> None:
        host_client.empty(8)

    def run_other() -> BaseException | None:
        try:
            asyncio.run(in_other_loop())
        except BaseException as exc:
            return exc
        return None

    err = await asyncio.get_running_loop().run_in_executor(None, run_other)
    assert isinstance(err, ac.LoopMismatchError)
    h = host_client.create(b"fine")
    assert await host_client.read([h]) == [b"fine"]


async def test_stream_id_is_per_task_and_can_be_pinned() -> None:
    mine = ac.StreamId.current()
    assert ac.StreamId.current() == mine

    async def child() -> ac.StreamId:
        return ac.StreamId.current()

    a, b = await asyncio.gather(child(), child())
    assert len({mine, a, b}) == 3
    with ac.StreamId.pinned(ac.StreamId(4242)) as pinned:
        assert ac.StreamId.current() == pinned
        assert await asyncio.create_task(child()) == pinned
    assert ac.StreamId.current() == mine


async def test_pinned_stream_carries_handles(host_client: ac.ComputeClient) -> None:
    with ac.StreamId.pinned(77):
        h = host_client.create(b"pinned")
    assert h.stream == ac.StreamId(77)
    assert await host_client.read([h]) == [b"pinned"]


async def test_lag_probe_detects_a_blocked_loop() -> None:
    import threading
    import time

    from .lagprobe import LoopLagProbe

    probe = LoopLagProbe()
    probe.start()
    await asyncio.sleep(0)
    time.sleep(0.001)  # noqa: ASYNC251 - below the limit: tolerated
    await asyncio.sleep(0)
    assert 0.001 <= await probe.stop() < 0.005
    for block in (
        lambda: time.sleep(0.012),
        lambda: threading.Event().wait(0.012),
        lambda: sum(range(3_000_000)),  # CPU-bound blocking
    ):
        probe = LoopLagProbe()
        probe.start()
        await asyncio.sleep(0)
        block()
        resumed_at = sys._getframe().f_lineno + 1
        await asyncio.sleep(0)
        assert await probe.stop() > 0.005
        assert "test_lag_probe_detects_a_blocked_loop" in probe.culprit
        # and where the step ended: this test's await after the block
        assert probe.culprit.endswith(f", which ended at test_channel.py:{resumed_at}")


async def test_a_loaded_kernel_with_a_static_count_skips_prepare() -> None:
    """A server that lists its loaded kernels is not asked to prepare a launch of one
    (the CUDA server: nothing to compile or read back); others still are."""
    calls: list[str] = []

    class Preparing(ac.HostServer):
        loaded_kernels = frozenset({ADD.id})

        def prepare(self, kernel: ac.Kernel, count: ac.CubeCount, stream: object) -> None:
            calls.append(kernel.id)

    client = ac.ComputeClient(Preparing(), asyncio.get_running_loop())
    try:
        a, b, out = client.create(bytes(16)), client.create(bytes(16)), client.empty(16)
        client.execute(ADD, blocks(4), add_bindings(a, b, out, 4))
        client.execute(NOOP, ac.CubeCount(1), ac.Bindings())
        dims = client.create(np.ones(3, np.uint32))
        client.execute(ADD, ac.CubeCount.dynamic(dims.binding()), add_bindings(a, b, out, 4))
        await client.sync()
    finally:
        await client.close()
    assert calls == [NOOP.id, ADD.id]  # not the first launch: loaded, static count


class _SlowBatches(ac.HostServer):
    """A host server whose every launch takes 200 µs on the loop and counts batches."""

    def __init__(self) -> None:
        super().__init__()
        self.batches = self.launches = 0

    def execute(self, *args: Any) -> None:
        deadline = time.perf_counter() + 200e-6
        while time.perf_counter() < deadline:
            pass
        super().execute(*args)
        self.launches += 1

    def end_batch(self) -> None:
        self.batches += 1
        super().end_batch()


@pytest.mark.parametrize(("batch_us", "most_batches"), [(1_000_000, 1), (10, None)])
async def test_the_batch_budget_bounds_the_work_of_one_loop_iteration(
    batch_us: int, most_batches: int | None
) -> None:
    """10 launches of 200 µs queued in one go: a budget of a second runs them inline in
    one batch; a budget of 10 µs runs the first inline and the actor yields after each
    of the others (a batch each)."""
    server = _SlowBatches()
    loop = asyncio.get_running_loop()
    client = ac.ComputeClient(server, loop, batch_seconds=batch_us * 1e-6)
    try:
        await client.sync()
        server.batches = 0
        for _ in range(10):
            client.execute(NOOP, ac.CubeCount(1), ac.Bindings())
        await client.sync()
    finally:
        await client.close()
    if most_batches is not None:
        assert server.batches <= most_batches + 1  # + the sync's own batch
    else:
        assert server.batches >= 10


async def test_the_channel_is_idle_once_every_command_ran() -> None:
    """The actor yields after each command here (a budget of 1 µs): once the last one
    ran, the channel is idle even while the actor still sits in that yield (a DLPack
    export or a fast sync right after ``await client.sync()`` must not be refused)."""
    server = _SlowBatches()
    client = ac.ComputeClient(server, asyncio.get_running_loop(), batch_seconds=1e-6)
    try:
        await client.sync()
        base = server.launches
        for _ in range(3):  # the first runs inline, the others wait for the actor
            client.execute(NOOP, ac.CubeCount(1), ac.Bindings())
        seen: list[bool] = []
        for _ in range(1000):  # (bounded: a lost command fails, it does not hang)
            if len(seen) == 3:
                break
            if server.launches - base == 3:
                seen.append(client._channel.idle())
            await asyncio.sleep(0)
        assert seen == [True, True, True]
    finally:
        await client.close()


async def test_the_batch_budget_comes_from_the_configuration() -> None:
    async with ac.open_client("host", config={"streaming": {"batch_us": 250}}) as client:
        assert client.config is not None and client.config.streaming.batch_us == 250
        assert client._channel.budget == pytest.approx(250e-6)
    with pytest.raises(ac.ConfigError, match="batch_us"):
        async with ac.open_client("host", config={"streaming": {"batch_us": 5}}):
            pass


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), 5000, "1", True])
async def test_a_batch_budget_that_is_not_a_duration_is_refused(bad: object) -> None:
    with pytest.raises(ac.InvalidArgument, match="batch_seconds must be"):
        ac.ComputeClient(ac.HostServer(), asyncio.get_running_loop(), batch_seconds=bad)  # type: ignore[arg-type]


async def test_launches_that_waited_for_the_actor_run_in_order(device: str) -> None:
    """The first launch of a kernel loads it in a worker thread, so the launches sent
    after it wait for the actor; they run in order (on CUDA through
    ``FastLaunch.queued``): out = a + b, then out = out + b, nine times."""
    n = 4096
    a = np.arange(n, dtype=np.float32)
    b = np.full(n, 0.5, np.float32)
    async with ac.open_client(device) as client:
        ha, hb, out = client.create(a), client.create(b), client.empty(4 * n)
        fast = client._fast
        before = tuple(fast.queued_stats) if fast is not None else (0, 0)
        client.execute(ADD, blocks(n), add_bindings(ha, hb, out, n))
        for _ in range(9):
            client.execute(ADD, blocks(n), add_bindings(out, hb, out, n))
        got = await client.read_array(out, np.float32)
        if fast is not None:
            hits, _ = fast.queued_stats
            assert hits - before[0] == 9, (before, tuple(fast.queued_stats))
    np.testing.assert_array_equal(got, a + 10 * b)


async def test_a_batch_end_does_not_look_at_every_pending_future(
    host_client: ac.ComputeClient,
) -> None:
    """Futures that other clients' commands wait on (``to_client``, ``all_reduce``) are
    tracked by the channel and leave it once done; a batch end looks at what is pending
    only now and then, not at every batch (2000 tracked futures and 20 batches: at
    most 4000 looks, where a look at every batch end made 40,000; 2000 copies in a row
    went quadratic)."""
    looks = 0

    class Counted(asyncio.Future[None]):
        def done(self) -> bool:
            nonlocal looks
            looks += 1
            return super().done()

    loop = asyncio.get_running_loop()
    futures = [Counted(loop=loop) for _ in range(2000)]
    channel = host_client._channel  # type: ignore[attr-defined]
    for fut in futures:
        channel.track(fut)
    for _ in range(20):
        host_client.empty(16)  # a command run inline: its batch ends with the iteration
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    assert looks <= 4000
    for fut in futures:
        fut.set_result(None)
    await asyncio.sleep(0)
    assert not channel._pending.intersection(futures)  # gone once done
