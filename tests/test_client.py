"""Every client method, on each device the suite can use, under asyncio and trio."""

from __future__ import annotations

import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, SCALE, add_bindings, blocks
from .tasks import in_task

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio


async def test_create_and_read_bytes(client: ac.ComputeClient) -> None:
    h = client.create(b"hello asynccube")
    assert h.size == 15
    assert await client.read([h.binding()]) == [b"hello asynccube"]


async def test_create_from_array_is_a_snapshot(client: ac.ComputeClient) -> None:
    arr = np.arange(8, dtype=np.int32)
    h = client.create(arr)
    arr[:] = -1
    np.testing.assert_array_equal(await client.read_array(h, np.int32), np.arange(8))


async def test_empty_then_write_and_read(client: ac.ComputeClient) -> None:
    h = client.empty(16)
    client.write([(h.copy_descriptor((4,), (1,), 4), np.array([1, 2, 3, 4], np.float32))])
    out = await client.read_array(h, np.float32)
    np.testing.assert_array_equal(out, [1, 2, 3, 4])


async def test_execute_add(client: ac.ComputeClient) -> None:
    n = 1000
    a, b = np.random.rand(n).astype(np.float32), np.random.rand(n).astype(np.float32)
    ha, hb, out = client.create(a), client.create(b), client.empty(4 * n)
    client.execute(ADD, blocks(n), add_bindings(ha, hb, out, n))
    np.testing.assert_array_equal(await client.read_array(out, np.float32), a + b)


async def test_execute_with_float_scalar(client: ac.ComputeClient) -> None:
    x = np.arange(10, dtype=np.float32)
    h = client.create(x)
    bindings = (
        ac.Bindings()
        .with_buffer(h.binding())
        .with_scalar(np.float32, [2.5])
        .with_scalar(np.uint32, [10])
    )
    client.execute(SCALE, blocks(10), bindings)
    np.testing.assert_array_equal(await client.read_array(h, np.float32), x * 2.5)


async def test_offsets_read_a_window(client: ac.ComputeClient) -> None:
    h = client.create(bytes(range(32)))
    window = h.with_offset_start(4).with_offset_end(8)
    assert window.size == 20
    assert await client.read([window.binding()]) == [bytes(range(4, 24))]


async def test_create_tensors_and_strided_read(client: ac.ComputeClient) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ((h, strides),) = client.create_tensors([a], [(3, 4)], [4])
    assert strides[1] == 1 and strides[0] >= 4
    (raw,) = await client.read_tensor([h.copy_descriptor((3, 4), strides, 4)])
    np.testing.assert_array_equal(np.frombuffer(raw, np.float32).reshape(3, 4), a)
    # A transposed view through strides.
    (raw_t,) = await client.read_tensor([h.copy_descriptor((4, 3), (1, strides[0]), 4)])
    np.testing.assert_array_equal(np.frombuffer(raw_t, np.float32).reshape(4, 3), a.T)


async def test_empty_tensors_optimized_rows_are_pitched(client: ac.ComputeClient) -> None:
    ((h, strides),) = client.empty_tensors([(128, 100)], [4])
    align = client.properties.alignment
    assert (strides[0] * 4) % min(align, 512) == 0
    assert strides[0] >= 100 and h.size >= 128 * strides[0] * 4
    ((c, cs),) = client.empty_tensors([(128, 100)], [4], ac.AllocationKind.CONTIGUOUS)
    assert cs == (100, 1) and c.size == 128 * 100 * 4


async def test_tensor_helpers_round_trip(client: ac.ComputeClient) -> None:
    a = np.random.rand(5, 7).astype(np.float64)
    t = client.create_array(a)
    np.testing.assert_array_equal(await client.read_array(t), a)
    e = client.empty_array((3, 33), np.float32, ac.AllocationKind.OPTIMIZED)
    data = np.random.rand(3, 33).astype(np.float32)
    client.write([(e.copy_descriptor(), data)])
    np.testing.assert_array_equal(await client.read_array(e), data)


async def test_sync_and_flush(client: ac.ComputeClient) -> None:
    client.flush()
    assert await client.sync() is None


async def test_get_resource(client: ac.ComputeClient) -> None:
    h = client.create(bytes(range(16))).with_offset_start(4)
    res = await client.get_resource(h.binding())
    assert res.size == 12
    assert res.offset == 4
    if client.device == "host":
        assert bytes(res.resource) == bytes(range(4, 16))


async def test_memory_usage_and_cleanup(client: ac.ComputeClient) -> None:
    before = await client.memory_usage()
    h = client.empty(1 << 20)
    during = await client.memory_usage()
    assert during.bytes_in_use >= before.bytes_in_use + (1 << 20)
    assert during.number_allocs == before.number_allocs + 1
    del h
    client.memory_cleanup()
    after = await client.memory_usage()
    assert after.bytes_in_use == before.bytes_in_use
    assert after.bytes_reserved <= during.bytes_reserved


async def test_profiles_nest_and_overlap(client: ac.ComputeClient) -> None:
    outer = client.start_profile()
    inner = client.start_profile()
    h = client.create(np.zeros(1000, np.float32))
    client.execute(SCALE, blocks(1000), _scale(h, 1000))
    d_inner = await client.end_profile(inner)
    d_outer = await client.end_profile(outer)
    assert d_inner.duration_ns >= 0
    assert d_outer.start_ns <= d_inner.start_ns <= d_inner.end_ns <= d_outer.end_ns
    async with client.profile() as out:
        await client.sync()
    assert out[0].seconds >= 0


async def test_allocation_mode_persistent(client: ac.ComputeClient) -> None:
    client.allocation_mode(ac.MemoryAllocationMode.PERSISTENT)
    h = client.create(b"x" * 100)
    client.allocation_mode(ac.MemoryAllocationMode.AUTO)
    assert await client.read([h]) == [b"x" * 100]


async def test_can_mut(client: ac.ComputeClient) -> None:
    h = client.empty(8)
    assert h.can_mut()
    b = h.binding()
    assert not h.can_mut()
    del b
    assert h.can_mut()
    other = h.with_offset_start(0)  # a second Handle over the same slice
    assert not h.can_mut()
    del other
    assert h.can_mut()

    async def other_task() -> bool:
        return h.can_mut()

    assert not await in_task(other_task)


async def test_handle_cursor_is_stamped(client: ac.ComputeClient) -> None:
    h1 = client.empty(8)
    h2 = client.empty(8)
    await client.sync()
    assert 0 < h1.cursor < h2.cursor
    assert h1.stream == ac.StreamId.current()


async def test_device_and_properties(client: ac.ComputeClient) -> None:
    assert client.device == "host" or client.device.startswith("cuda:")
    props = client.properties
    assert props.max_allocation > 0 and props.alignment > 0
    assert client.device in repr(client)


def _scale(h: ac.Handle, n: int) -> ac.Bindings:
    return ac.Bindings().with_buffer(h).with_scalar(np.float32, [2.0]).with_scalar(np.uint32, [n])


async def test_staging_buffers_are_handed_over_not_copied(client: ac.ComputeClient) -> None:
    (buf,) = await client.staging([64])
    assert buf.dtype == np.uint8 and buf.size == 64 and buf.flags.writeable
    np.copyto(buf, np.arange(64, dtype=np.uint8))
    h = client.create(buf)
    client.write([(h.copy_descriptor((32,), (1,), 1), buf[32:].copy())])
    assert await client.read([h]) == [bytes(range(32, 64)) * 2]
    plain = np.zeros(4, np.uint8)
    snap = client.create(plain)
    plain[:] = 9  # an ordinary array is snapshotted at the call
    assert await client.read([snap]) == [bytes(4)]
    with pytest.raises(ac.InvalidArgument):
        await client.staging([-1])
