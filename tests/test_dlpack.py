"""DLPack on the host server: export to numpy and import from it without a copy, buffer
lifetimes, and every bad input refused with a typed error while the client serves on."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from typing import Any

import numpy as np
import pytest

import asynccube as ac

from .kernels import SCALE, SLOW_FILL, blocks


class Producer:
    """A DLPack producer that can be weakly referenced (numpy arrays cannot)."""

    def __init__(self, array: np.ndarray[Any, Any], device: tuple[int, int] = (1, 0)) -> None:
        self.array = array
        self.device = device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


async def _serves(client: ac.ComputeClient) -> None:
    """The client still works."""
    assert (await client.read([client.create(b"ok")]))[0] == b"ok"


@pytest.mark.asyncio
async def test_export_shares_memory_with_numpy(host_client: ac.ComputeClient) -> None:
    t = host_client.create_array(np.arange(6, dtype=np.float32).reshape(2, 3))
    await host_client.sync()
    assert t.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(t)
    assert a.shape == (2, 3) and a.dtype == np.float32
    np.testing.assert_array_equal(a, np.arange(6).reshape(2, 3))
    a[1, 2] = 42.0  # the consumer writes asynccube's buffer: no copy was made
    assert (await host_client.read_array(t))[1, 2] == 42.0


@pytest.mark.asyncio
async def test_export_of_a_strided_view(host_client: ac.ComputeClient) -> None:
    h = host_client.create(np.arange(12, dtype=np.int32))
    view = host_client.tensor(h, (3, 2), np.int32, strides=(4, 2))
    await host_client.sync()
    np.testing.assert_array_equal(np.from_dlpack(view), [[0, 2], [4, 6], [8, 10]])


@pytest.mark.asyncio
async def test_versioned_capsule_only_when_asked(host_client: ac.ComputeClient) -> None:
    t = host_client.create_array(np.zeros(4, np.uint8))
    await host_client.sync()
    assert "dltensor_versioned" in repr(t.__dlpack__(max_version=(1, 0)))
    legacy = repr(t.__dlpack__())
    assert '"dltensor"' in legacy


@pytest.mark.asyncio
async def test_exported_buffer_outlives_the_tensor_and_is_not_reused(
    host_client: ac.ComputeClient,
) -> None:
    t = host_client.create_array(np.full(1024, 7, np.int64))
    await host_client.sync()
    consumer = np.from_dlpack(t)
    del t
    gc.collect()
    others = [host_client.create_array(np.full(1024, -1, np.int64)) for _ in range(8)]
    await host_client.sync()
    assert (consumer == 7).all()  # the pool did not hand the slice to another buffer
    assert len(others) == 8
    del others
    gc.collect()
    with_consumer = (await host_client.memory_usage()).bytes_in_use
    del consumer  # the last holder: the buffer goes back now
    gc.collect()
    host_client.memory_cleanup()
    assert (await host_client.memory_usage()).bytes_in_use == with_consumer - 8 * 1024


@pytest.mark.asyncio
async def test_import_shares_memory_and_never_enters_the_pools(
    host_client: ac.ComputeClient,
) -> None:
    before = await host_client.memory_usage()
    x = np.arange(8, dtype=np.float64).reshape(2, 4)
    t = host_client.from_dlpack(x)
    assert (t.shape, t.strides, t.dtype) == ((2, 4), (4, 1), np.float64)
    x[0, 0] = -5.0  # the producer writes: asynccube sees it
    assert (await host_client.read_array(t))[0, 0] == -5.0
    host_client.write([(t.copy_descriptor(), np.full((2, 4), 3.0))])
    await host_client.sync()
    assert (x == 3.0).all()  # asynccube writes the producer's memory
    assert (await host_client.memory_usage()).bytes_in_use == before.bytes_in_use


@pytest.mark.asyncio
async def test_import_keeps_the_producer_alive_while_used(host_client: ac.ComputeClient) -> None:
    producer = Producer(np.full(16, 9, np.int16))
    alive = weakref.ref(producer)
    t = host_client.from_dlpack(producer)
    del producer
    gc.collect()
    assert alive() is not None
    assert (await host_client.read_array(t) == 9).all()
    del t
    await host_client.sync()
    await host_client.memory_usage()  # the actor drains dropped handles
    gc.collect()
    assert alive() is None


@pytest.mark.asyncio
async def test_a_loop_of_imports_holds_no_producer_past_its_last_handle(
    host_client: ac.ComputeClient,
) -> None:
    """Import, read back, drop: each producer is let go once the actor has run a batch
    after its tensor was dropped, with no allocation, no ``memory_usage()`` and no
    garbage collector in between (the host server released dropped handles only where
    it allocated or reported memory: a loop like this one held every producer)."""
    gc.disable()
    try:
        alive = []
        for i in range(20):
            producer = Producer(np.full(256, i, np.float32))
            alive.append(weakref.ref(producer))
            t = host_client.from_dlpack(producer)
            del producer
            assert (await host_client.read_array(t) == i).all()
            del t
        await host_client.sync()
        assert sum(r() is not None for r in alive) == 0
    finally:
        gc.enable()
    await _serves(host_client)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("obj", "words"),
    [
        (np.arange(8, dtype=np.float32)[::2], "not C-contiguous"),
        (Producer(np.zeros(4, np.float32), device=(2, 0)), r"device \(2, 0\)"),
        (b"bytes", "does not implement the DLPack protocol"),
    ],
    ids=["strided", "foreign-device", "no-protocol"],
)
async def test_bad_imports_are_refused(host_client: ac.ComputeClient, obj: Any, words: str) -> None:
    with pytest.raises(ac.DLPackError, match=words):
        host_client.from_dlpack(obj, copy=False)  # share or raise
    await _serves(host_client)


@pytest.mark.asyncio
async def test_read_only_import_is_refused(host_client: ac.ComputeClient) -> None:
    x = np.zeros(4, np.float32)
    x.flags.writeable = False
    with pytest.raises(ac.DLPackError, match=r"read-only.*copy=None"):
        host_client.from_dlpack(x, copy=False)
    t = host_client.from_dlpack(x)  # copy=None: what cannot be shared is copied
    host_client.write([(t.copy_descriptor(), np.ones(4, np.float32))])
    np.testing.assert_array_equal(await host_client.read_array(t), 1.0)
    assert (x == 0.0).all()
    await _serves(host_client)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"stream": 1}, "CPU memory has no streams"),
        ({"dl_device": (2, 0)}, "another device"),
        ({"dl_device": 1}, r"dl_device must be a \(device type, index\) tuple"),
        ({"dl_device": (1.0, 0)}, r"dl_device must be a \(device type, index\) tuple"),
        ({"max_version": "1.0"}, "max_version must be"),
        ({"copy": "yes"}, "copy must be"),
    ],
)
async def test_bad_export_requests_are_refused(
    host_client: ac.ComputeClient, kwargs: dict[str, Any], words: str
) -> None:
    t = host_client.create_array(np.zeros(4, np.float32))
    await host_client.sync()
    with pytest.raises(ac.DLPackError, match=words):
        t.__dlpack__(**kwargs)
    await _serves(host_client)


@pytest.mark.asyncio
@pytest.mark.parametrize("device", [np.array([1, 0]), 1, (1,), ("cpu", 0)], ids=str)
async def test_an_import_device_that_names_no_device_is_refused(
    host_client: ac.ComputeClient, device: Any
) -> None:
    with pytest.raises(ac.DLPackError, match=r"from_dlpack\(device=.*give None, a device"):
        host_client.from_dlpack(np.zeros(4, np.float32), device=device)
    for good in (None, "host", "cpu", (1, 0)):
        assert host_client.from_dlpack(np.zeros(4, np.float32), device=good).shape == (4,)
    await _serves(host_client)


def _scale(t: ac.Tensor, factor: float) -> ac.Bindings:
    n = t.shape[0]
    return (
        ac.Bindings()
        .with_buffers([t.binding()])
        .with_scalar(np.float32, [factor])
        .with_scalar(np.uint32, [n])
    )


@pytest.mark.asyncio
async def test_export_right_after_execute_sees_the_kernels_result(
    host_client: ac.ComputeClient,
) -> None:
    await host_client.sync()  # the stream's worker thread is started (not part of this)
    data = np.arange(1024, dtype=np.float32)
    t = host_client.create_array(data)
    host_client.execute(SCALE, blocks(1024), _scale(t, 3.0))  # fire-and-forget
    np.testing.assert_array_equal(np.from_dlpack(t), data * 3.0)  # no sync in between


@pytest.mark.asyncio
async def test_export_runs_the_commands_still_queued_for_the_actor(
    host_client: ac.ComputeClient,
) -> None:
    await host_client.sync()  # the stream's worker thread is started (not part of this)
    data = np.arange(256, dtype=np.float32)
    t = host_client.create_array(data)
    channel = host_client._channel
    channel._inline_spent = channel.budget  # as past the inline budget: commands queue
    host_client.execute(SCALE, blocks(256), _scale(t, 1.5))
    other = host_client.create_array(np.zeros(256, np.float32))
    host_client.execute(SCALE, blocks(256), _scale(t, 2.0))
    assert host_client._channel._queue, "the test needs commands still queued"
    np.testing.assert_array_equal(np.from_dlpack(t), data * 3.0)
    assert not host_client._channel._queue
    await host_client.sync()
    np.testing.assert_array_equal(np.from_dlpack(other), 0.0)


@pytest.mark.asyncio
async def test_export_waits_only_for_the_stream_that_last_used_the_buffer(
    host_client: ac.ComputeClient,
) -> None:
    slow = host_client.create_array(np.zeros(4, np.float32))
    with ac.StreamId.pinned(1):
        t = host_client.create_array(np.arange(4, dtype=np.float32))
    with ac.StreamId.pinned(2):  # 300 ms on another stream's worker, on another buffer
        host_client.execute(SLOW_FILL, ac.CubeCount(1), _slow(slow, 0.3))
    with ac.StreamId.pinned(1):
        host_client.execute(SCALE, blocks(4), _scale(t, 2.0))
    start = time.perf_counter()
    while True:  # a loaded machine may not run stream 1's worker within one 3 ms wait
        try:
            exported = np.from_dlpack(t)
            break
        except ac.DLPackError:
            assert time.perf_counter() - start < 0.25, "the export waited for stream 2"
            await asyncio.sleep(0.002)
    assert time.perf_counter() - start < 0.28  # before stream 2's 300 ms kernel ended
    np.testing.assert_array_equal(exported, [0.0, 2.0, 4.0, 6.0])
    await host_client.sync()


def _slow(t: ac.Tensor, seconds: float) -> ac.Bindings:
    return (
        ac.Bindings()
        .with_buffers([t.binding()])
        .with_scalar(np.float32, [seconds])
        .with_scalar(np.uint8, [0])
    )


@pytest.mark.asyncio
async def test_export_behind_long_work_is_refused_not_blocked(
    host_client: ac.ComputeClient,
) -> None:
    t = host_client.create_array(np.zeros(4, np.float32))
    host_client.execute(SLOW_FILL, ac.CubeCount(1), _slow(t, 0.05))  # 50 ms on a worker
    with pytest.raises(ac.DLPackError, match=r"still running.*await client.sync\(\)"):
        np.from_dlpack(t)
    await host_client.sync()
    assert np.from_dlpack(t).shape == (4,)


@pytest.mark.asyncio
async def test_export_behind_a_compile_is_refused_not_blocked(
    host_client: ac.ComputeClient,
) -> None:
    t = host_client.create_array(np.zeros(4, np.float32))
    gate = asyncio.Event()

    async def compile_job() -> None:  # what a command waiting on a worker job returns
        await gate.wait()

    host_client._channel.send(compile_job)  # started inline: the actor awaits it next
    host_client.execute(SCALE, blocks(4), _scale(t, 2.0))  # queued behind it
    with pytest.raises(ac.DLPackError, match="waits on a job in a worker thread"):
        np.from_dlpack(t)
    await asyncio.sleep(0)  # the actor now awaits the job
    assert host_client._channel._blocked
    with pytest.raises(ac.DLPackError, match="waits on a job in a worker thread"):
        np.from_dlpack(t)
    gate.set()
    await host_client.sync()
    np.testing.assert_array_equal(np.from_dlpack(t), 0.0)


@pytest.mark.asyncio
async def test_export_from_a_closed_client_or_freed_tensor() -> None:
    client = await ac.connect("host")
    t = client.create_array(np.zeros(4, np.float32))
    bare = ac.Tensor(t.handle, t.shape, t.strides, t.dtype)
    with pytest.raises(ac.InvalidArgument, match=r"client\.tensor"):
        np.from_dlpack(bare)
    await client.close()
    with pytest.raises(ac.ClientClosedError):
        np.from_dlpack(t)


@pytest.mark.asyncio
async def test_export_of_an_invalid_handle(host_client: ac.ComputeClient) -> None:
    other = await ac.connect("host")
    try:
        with pytest.raises(ac.InvalidHandle, match="another client"):
            host_client.tensor(other.create(b"abcd"), (4,), np.uint8)  # refused at the call
        await other.sync()
    finally:
        await other.close()
    await _serves(host_client)


@pytest.mark.asyncio
async def test_tensor_view_arguments_are_checked(host_client: ac.ComputeClient) -> None:
    h = host_client.create(bytes(16))
    with pytest.raises(ac.InvalidArgument, match="addresses 32 bytes"):
        host_client.tensor(h, (8,), np.float32)
    with pytest.raises(ac.InvalidArgument, match="differ in length"):
        host_client.tensor(h, (2, 2), np.float32, strides=(1,))
    with pytest.raises(ac.InvalidArgument, match="ints >= 0"):
        host_client.tensor(h, (-1,), np.float32)
    assert host_client.tensor(h, (2, 2), np.float32).strides == (2, 1)


@pytest.mark.asyncio
async def test_host_tensors_have_no_cuda_array_interface(host_client: ac.ComputeClient) -> None:
    t = host_client.create_array(np.zeros(4, np.float32))
    assert not hasattr(t, "__cuda_array_interface__")
    await _serves(host_client)
