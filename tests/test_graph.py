"""Graphs: capture, replay, updates and what cannot be captured, on each device."""

from __future__ import annotations

import gc

import anyio
import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, SCALE, add_bindings, blocks
from .tasks import in_task

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio

N = 256


def scale(h: ac.Handle, factor: float, n: int = N) -> ac.Bindings:
    """Bindings for SCALE over n float32."""
    return (
        ac.Bindings()
        .with_buffer(h.binding())
        .with_scalar(np.float32, [factor])
        .with_scalar(np.uint32, [n])
    )


async def test_replay_runs_the_captured_kernels(client: ac.ComputeClient) -> None:
    x = np.arange(N, dtype=np.float32)
    h = client.create(x)
    async with client.capture() as graph:
        client.execute(SCALE, blocks(N), scale(h, 2.0))
        client.execute(SCALE, blocks(N), scale(h, 3.0))
    np.testing.assert_array_equal(await client.read_array(h, np.float32), x)  # not run yet
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), x * 6)
    graph.replay()
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), x * 216)
    assert graph.kernels == [SCALE.id, SCALE.id]


async def test_captured_write_is_replayed(client: ac.ComputeClient) -> None:
    h = client.create(np.zeros(N, np.float32))
    ones = np.ones(N, np.float32)
    async with client.capture() as graph:
        client.write([(h.copy_descriptor((N,), (1,), 4), ones)])
        client.execute(SCALE, blocks(N), scale(h, 5.0))
    for _ in range(2):
        graph.replay()
        np.testing.assert_array_equal(await client.read_array(h, np.float32), ones * 5)


async def test_updates_take_new_scalars_and_buffers(client: ac.ComputeClient) -> None:
    a, b = np.arange(N, dtype=np.float32), np.full(N, 2, np.float32)
    ha, hb, out = client.create(a), client.create(b), client.empty(4 * N)
    other = client.create(np.full(N, 10, np.float32))
    async with client.capture() as graph:
        client.execute(ADD, blocks(N), add_bindings(ha, hb, out, N))
        client.execute(SCALE, blocks(N), scale(out, 1.0))
    graph.replay(updates={0: add_bindings(ha, other, out, N), 1: scale(out, 0.5)})
    np.testing.assert_array_equal(await client.read_array(out, np.float32), (a + 10) * 0.5)
    graph.replay()  # updates stay in effect
    np.testing.assert_array_equal(await client.read_array(out, np.float32), (a + 10) * 0.5)


async def test_bad_updates_raise_and_the_client_keeps_serving(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))
    small = client.create(np.ones(N // 2, np.float32))
    async with client.capture() as graph:
        client.execute(SCALE, blocks(N), scale(h, 2.0))
    with pytest.raises(ac.GraphUpdateError, match="buffer 0 has 512 bytes, the captured one 1024"):
        graph.replay(updates={0: scale(small, 2.0)})
    with pytest.raises(ac.GraphUpdateError, match="not a launch of this graph"):
        graph.replay(updates={3: scale(h, 2.0)})
    with pytest.raises(ac.GraphUpdateError, match="must match the captured"):
        graph.replay(updates={0: ac.Bindings().with_buffer(h.binding())})
    async with ac.open_client("host") as third:
        foreign = third.create(np.ones(N, np.float32))
        with pytest.raises(ac.InvalidHandle, match="belongs to another client"):
            graph.replay(updates={0: scale(foreign, 2.0)})
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 2.0))


async def _capture_then(client: ac.ComputeClient, h: ac.Handle, op: str) -> None:
    async with client.capture():
        client.execute(SCALE, blocks(N), scale(h, 2.0))
        if op == "read":
            await client.read([h])
        elif op == "sync":
            await client.sync()
        elif op == "memory_usage":
            await client.memory_usage()
        else:
            async with ac.open_client("host") as other:
                client.to_client(h, other)


@pytest.mark.parametrize("op", ["read", "sync", "memory_usage", "to_client"])
async def test_uncapturable_operations_end_the_capture(client: ac.ComputeClient, op: str) -> None:
    h = client.create(np.ones(N, np.float32))
    with pytest.raises(ac.GraphCaptureError, match=rf"{op}\(\) cannot be captured"):
        await _capture_then(client, h, op)
    # the capture ended cleanly: nothing ran, and the client works as before
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.ones(N))
    client.execute(SCALE, blocks(N), scale(h, 3.0))
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 3.0))


async def _swallow(client: ac.ComputeClient, h: ac.Handle) -> None:
    async with client.capture():
        with pytest.raises(ac.GraphCaptureError):
            await client.sync()
        with pytest.raises(ac.GraphCaptureError, match=r"execute\(\): the capture was ended"):
            client.execute(SCALE, blocks(N), scale(h, 2.0))


async def test_swallowed_capture_error_still_fails_the_block(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))
    with pytest.raises(ac.GraphCaptureError, match=r"ended by sync\(\)"):
        await _swallow(client, h)
    await client.sync()


async def test_allocation_needing_a_new_page_cannot_be_captured(client: ac.ComputeClient) -> None:
    big = 64 << 20
    with pytest.raises(ac.GraphCaptureError, match="needs a new page"):
        async with client.capture():
            client.empty(big)
    h = client.empty(big)  # after the capture, the same allocation works
    await client.sync()
    assert h.size == big


async def test_allocation_from_existing_pages_is_captured(client: ac.ComputeClient) -> None:
    keep = client.create(np.ones(N, np.float32))
    async with client.capture() as graph:
        h = client.create(np.full(N, 3, np.float32))
        client.execute(ADD, blocks(N), add_bindings(keep, h, h, N))
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 4.0))


async def test_dynamic_count_cannot_be_captured(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))
    count = client.create(np.array([1, 1, 1], np.uint32))
    with pytest.raises(ac.GraphCaptureError, match="dynamic CubeCount"):
        async with client.capture():
            client.execute(SCALE, ac.CubeCount.dynamic(count), scale(h, 2.0))
    await client.sync()


async def test_a_capture_does_not_span_tasks(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))
    stream = ac.StreamId(1000)

    async def intruder() -> None:
        with ac.StreamId.pinned(stream):
            client.execute(SCALE, blocks(N), scale(h, 2.0))

    with ac.StreamId.pinned(stream):
        async with client.capture() as graph:
            client.execute(SCALE, blocks(N), scale(h, 3.0))
            with pytest.raises(ac.GraphCaptureError, match="another task is capturing"):
                await in_task(intruder)
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 3.0))


async def test_other_streams_run_during_a_capture(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))
    g = client.create(np.ones(N, np.float32))

    async def other_task() -> np.ndarray:
        client.execute(SCALE, blocks(N), scale(g, 7.0))
        return await client.read_array(g, np.float32)

    async with client.capture() as graph:
        client.execute(SCALE, blocks(N), scale(h, 2.0))
        done = await in_task(other_task)
    np.testing.assert_array_equal(done, np.full(N, 7.0))
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 2.0))


async def test_graph_keeps_its_buffers_alive(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(1 << 16, np.float32))
    out = client.create(np.zeros(1 << 16, np.float32))
    async with client.capture() as graph:
        client.execute(SCALE, blocks(1 << 16), scale(h, 2.0, 1 << 16))
        client.execute(ADD, blocks(1 << 16), add_bindings(h, h, out, 1 << 16))
    before = (await client.memory_usage()).bytes_in_use
    del h
    gc.collect()
    assert (await client.memory_usage()).bytes_in_use == before  # the graph holds it
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(out, np.float32), np.full(1 << 16, 4))
    del graph
    gc.collect()
    for _ in range(50):  # released once the device has passed the last replay
        await client.sync()
        if (await client.memory_usage()).bytes_in_use < before:
            break
    assert (await client.memory_usage()).bytes_in_use < before


async def test_replay_after_close_raises(device: str) -> None:
    client = await ac.connect(device)
    h = client.create(np.ones(N, np.float32))
    async with client.capture() as graph:
        client.execute(SCALE, blocks(N), scale(h, 2.0))
    graph.replay()
    await client.close()
    with pytest.raises(ac.ClientClosedError):
        graph.replay()


async def test_nested_capture_and_replay_in_capture_raise(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))
    async with client.capture() as graph:
        client.execute(SCALE, blocks(N), scale(h, 2.0))
    with pytest.raises(ac.GraphCaptureError, match=r"replay\(\) cannot be captured"):
        async with client.capture():
            graph.replay()
    with pytest.raises(ac.GraphCaptureError, match=r"capture\(\) cannot be captured"):
        async with client.capture(), client.capture():
            pass
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 2.0))


async def _capture_and(client: ac.ComputeClient, h: ac.Handle, then: str) -> None:
    async with client.capture():
        client.execute(SCALE, blocks(N), scale(h, 2.0))
        if then == "die":
            client._channel.kill_for_test(RuntimeError("boom"))
            await anyio.sleep(0.01)
        else:
            await client.close()


async def test_a_client_dying_inside_a_capture_does_not_hang(device: str) -> None:
    client = await ac.connect(device)
    h = client.create(np.ones(N, np.float32))
    with pytest.raises(ac.ClientDeadError):
        await _capture_and(client, h, "die")
    await client.close()


async def test_closing_inside_a_capture_ends_it(device: str) -> None:
    client = await ac.connect(device)
    h = client.create(np.ones(N, np.float32))
    with pytest.raises(ac.GraphCaptureError, match=r"ended by close\(\)"):
        await _capture_and(client, h, "close")


async def test_other_tasks_allocate_new_pages_during_a_capture(client: ac.ComputeClient) -> None:
    h = client.create(np.ones(N, np.float32))

    async def other_task() -> int:
        big = client.empty(64 << 20)  # a new page, on another stream: allowed
        await client.sync()
        return big.size

    async with client.capture() as graph:
        client.execute(SCALE, blocks(N), scale(h, 2.0))
        assert await in_task(other_task) == 64 << 20
    graph.replay()
    np.testing.assert_array_equal(await client.read_array(h, np.float32), np.full(N, 2.0))
