"""Errors at the edges a new user meets (issue 28): a forgotten ``await`` loses nothing,
an awaited call drains the errors held before it in order, a read of a buffer whose
last writer failed raises, and a held error keeps no buffer alive. Each device of the
shared client suite, asyncio and trio."""

from __future__ import annotations

import gc
import time
import warnings

import anyio
import numpy as np
import pytest

import asynccube as ac

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio

SPIN_CUDA = r"""
extern "C" __global__ void spin(int *out) {
    long long start = clock64();
    while (clock64() - start < 100000000LL) { }
    out[0] = 1;
}
"""


def _spin_host(launch: ac.HostLaunch) -> None:
    time.sleep(0.05)
    launch.buffers[0].view(np.int32)[0] = 1


SLOW = ac.Kernel("test_edges_slow", cuda=ac.CudaSource(SPIN_CUDA, entry="spin"), host=_spin_host)
"""About 50 ms on either server; sets the first int32 of its buffer to 1."""


def _fail_one(launch: ac.HostLaunch) -> None:
    raise RuntimeError("failure one")


def _fail_two(launch: ac.HostLaunch) -> None:
    raise RuntimeError("failure two")


FAIL_1 = ac.Kernel("test_edges_fail_one", host=_fail_one)
FAIL_2 = ac.Kernel("test_edges_fail_two", host=_fail_two)
"""Fail on every server: the host part raises, the CUDA part is missing."""
FAILED = (ac.ExecutionError, ac.KernelNotSupported)


def _on(buffers: list[ac.Handle]) -> ac.Bindings:
    return ac.Bindings().with_buffers([h.binding() for h in buffers])


async def _surfaced(client: ac.ComputeClient, what: str) -> int:
    """How many of the next awaited calls raise an error naming ``what`` (a read of a
    fresh buffer, a sync, the close)."""
    count = 0
    for call in ("read", "sync"):
        try:
            if call == "read":
                await client.read([client.create(b"x")])
            else:
                await client.sync()
        except ac.AsyncCubeError as exc:
            count += str(exc).count(what) + "".join(getattr(exc, "__notes__", [])).count(what)
    return count


@pytest.mark.allow_loop_lag  # gc.collect() on the loop, on purpose: a full collection
async def test_a_forgotten_await_does_not_lose_a_kernel_failure(client: ac.ComputeClient) -> None:
    h = client.create(np.zeros(4, np.float32))
    client.execute(FAIL_1, ac.CubeCount(1), _on([h]))
    failed, reads = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        client.sync()  # the await forgotten
        for _ in range(5):  # its error comes back when the dropped future is freed
            with pytest.raises((*FAILED, ac.TaintedBuffer)) as read:
                await client.read_array(h, np.float32)  # never the stale zeros
            reads.append(read.value)
            try:
                await client.sync()
            except FAILED as exc:
                failed.append(exc)
            gc.collect()
    failed += [e for e in reads if isinstance(e, FAILED) and not isinstance(e, ac.TaintedBuffer)]
    assert len(failed) == 1 and "test_edges_fail_one" in str(failed[0])  # raised once
    assert any(isinstance(e, ac.TaintedBuffer) for e in reads)  # and the buffer tainted
    assert [str(w.message) for w in caught if "client.sync() at" in str(w.message)]
    client.write([(h.copy_descriptor((4,), (1,), 4), np.ones(4, np.float32).tobytes())])
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.ones(4))


async def test_an_unawaited_read_gives_its_error_back_to_its_stream(
    client: ac.ComputeClient,
) -> None:
    h = client.empty(16)
    with pytest.warns(RuntimeWarning, match=r"client\.read_tensor\(\)"):  # noqa: PT031
        client.read_tensor([h.copy_descriptor((8,), (1,), 4)])  # 32 of 16 bytes: fails
        with pytest.raises(ac.InvalidArgument):
            await client.sync()  # the dropped read's error, given back to the stream
    await client.sync()  # and raised only once


async def test_sync_drains_the_errors_held_before_it_in_order(client: ac.ComputeClient) -> None:
    marker = client.create(np.zeros(1, np.int32))
    with ac.StreamId.pinned(ac.StreamId(7)):
        client.execute(FAIL_1, ac.CubeCount(1), ac.Bindings())
    with ac.StreamId.pinned(ac.StreamId(8)):
        await client.sync()  # another stream: failure one stays held for stream 7
    with ac.StreamId.pinned(ac.StreamId(7)):
        client.execute(SLOW, ac.CubeCount(1), _on([marker]))
        client.execute(FAIL_2, ac.CubeCount(1), ac.Bindings())
        with pytest.raises(FAILED) as info:
            await client.sync()  # after SLOW and failure two, both at once
        text = str(info.value) + "\n".join(getattr(info.value, "__notes__", []))
        assert text.index("test_edges_fail_one") < text.index("test_edges_fail_two")
        assert (await client.read_array(marker, np.int32))[0] == 1  # SLOW had run
        await client.sync()  # nothing left for a later call
    await client.close()


async def test_a_read_of_a_tainted_buffer_raises_on_any_stream(client: ac.ComputeClient) -> None:
    h = client.create(np.arange(4, dtype=np.float32))
    with ac.StreamId.pinned(ac.StreamId(21)):
        client.execute(FAIL_1, ac.CubeCount(1), _on([h]))
    for stream in (22, 23, 22):
        with (
            ac.StreamId.pinned(ac.StreamId(stream)),
            pytest.raises(ac.TaintedBuffer, match="test_edges_fail_one"),
        ):
            await client.read_array(h, np.float32)
    with ac.StreamId.pinned(ac.StreamId(21)), pytest.raises(FAILED):
        await client.sync()  # the failure itself, once, on its own stream
    with ac.StreamId.pinned(ac.StreamId(22)):
        client.write([(h.copy_descriptor((4,), (1,), 4), np.full(4, 5, np.float32).tobytes())])
    with ac.StreamId.pinned(ac.StreamId(23)):
        np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(4, 5))


async def test_failed_calls_keep_no_memory_without_the_gc(client: ac.ComputeClient) -> None:
    await client.sync()
    before = await client.memory_usage()
    gc.disable()
    try:
        for _ in range(50):
            h = client.create(np.zeros(1 << 16, np.uint8))
            client.execute(FAIL_1, ac.CubeCount(1), _on([h]))
            try:
                await client.read_tensor([h.copy_descriptor((1 << 17,), (1,), 1)])
            except ac.AsyncCubeError:
                pass
            try:
                await client.sync()
            except ac.AsyncCubeError:
                pass
            del h
        await client.sync()
        after = await client.memory_usage()
    finally:
        gc.enable()
    assert after.bytes_in_use == before.bytes_in_use, f"before {before}, after {after}"


async def test_a_held_error_keeps_no_buffer_alive(client: ac.ComputeClient) -> None:
    await client.sync()
    before = await client.memory_usage()
    gc.disable()
    try:
        h = client.create(np.zeros(1 << 20, np.uint8))
        client.execute(FAIL_1, ac.CubeCount(1), _on([h]))
        del h
        with ac.StreamId.pinned(ac.StreamId(31)):
            await client.sync()  # the error stays held for the task's own stream
            held = await client.memory_usage()
        with pytest.raises(FAILED):
            await client.sync()
        after = await client.memory_usage()
    finally:
        gc.enable()
    assert held.bytes_in_use == after.bytes_in_use == before.bytes_in_use


async def test_close_raises_the_error_of_a_kept_but_unawaited_call(device: str) -> None:
    client = await ac.connect(device)
    h = client.empty(16)
    kept = client.read_tensor([h.copy_descriptor((8,), (1,), 4)])  # fails; never awaited
    await client.sync()  # another call does not take it: it belongs to ``kept``
    with pytest.raises(ac.InvalidArgument):
        await client.close()
    assert kept.done()
    del kept  # claimed by close: neither given back nor warned about again


# A thousand tasks started at once, and a gc.collect(): long loop steps, on purpose.
@pytest.mark.allow_loop_lag
async def test_a_thousand_tasks_lose_no_error(device: str) -> None:
    client = await ac.connect(device)
    raised, tasks = [], 999

    async def task(i: int) -> None:
        client.execute(FAIL_1, ac.CubeCount(1), ac.Bindings())
        if i % 3 == 0:
            client.sync()  # the await forgotten: its error goes back to the stream
            return
        try:
            await client.sync()
        except FAILED as exc:
            raised.append(exc)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        async with anyio.create_task_group() as tg:
            for i in range(tasks):
                tg.start_soon(task, i)
        await client.sync()
        gc.collect()
        with pytest.raises(FAILED) as at_close:
            await client.close()
    notes = getattr(at_close.value, "__notes__", [])
    lost = 1 + sum("also unobserved at close" in n for n in notes)
    assert (len(raised), lost) == (2 * tasks // 3, tasks // 3)
    assert sum("was never awaited" in str(w.message) for w in caught) == tasks // 3
