"""Zero-copy exchange with CuPy and PyTorch on the GPU (``__cuda_array_interface__``
v3, with its stream): the consumer sees asynccube's memory, ordered after its work, and
the buffer outlives the tensor while the consumer holds it."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import numpy as np
import pytest

import asynccube as ac

from .kernels import SCALE, blocks

pytestmark = [pytest.mark.cuda, pytest.mark.asyncio, pytest.mark.allow_loop_lag]


def _consumers() -> list[Any]:
    out = []
    try:
        import cupy

        out.append(("cupy", lambda t: cupy.asarray(t), lambda a: a.data.ptr, cupy.asnumpy))
    except ImportError:
        pass
    try:
        import torch

        out.append(
            (
                "torch",  # torch.as_tensor ignores the CAI stream: DLPack orders it
                lambda t: torch.from_dlpack(t),
                lambda a: a.data_ptr(),
                lambda a: a.cpu().numpy(),
            )
        )
    except ImportError:
        pass
    return out


def _scale(t: ac.Tensor, factor: float, n: int) -> ac.Bindings:
    return (
        ac.Bindings()
        .with_buffers([t.binding()])
        .with_scalar(np.float32, [factor])
        .with_scalar(np.uint32, [n])
    )


@pytest.mark.parametrize("consumer", _consumers(), ids=lambda c: c[0])
async def test_consumer_shares_memory_in_order(consumer: Any) -> None:
    _, take, pointer, to_numpy = consumer
    n = 1 << 20
    async with ac.open_client("cuda:0") as client:
        data = np.arange(n, dtype=np.float32)
        t = client.create_array(data)
        client.execute(SCALE, blocks(n), _scale(t, 1.0, n))  # compiled and loaded now
        await client.sync()
        for _ in range(20):  # queued on asynccube's stream, not waited for
            client.execute(SCALE, blocks(n), _scale(t, 2.0, n))
        while not client._channel.idle():  # noqa: ASYNC110 - past the 1 ms inline budget, the actor
            await asyncio.sleep(0)  # issues the rest (to the stream, not waited for)
        cai = t.__cuda_array_interface__
        assert cai["version"] == 3 and cai["stream"] not in (0, None)
        array = take(t)  # ordered after asynccube's stream by the consumer
        assert pointer(array) == cai["data"][0]  # no copy
        expected = data * 2.0**20
        np.testing.assert_array_equal(to_numpy(array), expected)
        del t
        gc.collect()
        await client.sync()
        others = [client.create_array(np.full(n, -1, np.float32)) for _ in range(4)]
        await client.sync()
        np.testing.assert_array_equal(to_numpy(array), expected)  # not reused by the pool
        assert len(others) == 4
        del array


async def test_cai_with_commands_still_queued_is_refused() -> None:
    async with ac.open_client("cuda:0") as client:
        t = client.create_array(np.zeros(1 << 20, np.float32))  # staged by a worker first
        if not client._channel.idle():
            with pytest.raises(ac.DLPackError, match="sync"):
                _ = t.__cuda_array_interface__
        await client.sync()
        assert t.__cuda_array_interface__["data"][0] != 0


def _dlpack_consumers() -> list[Any]:
    out = []
    try:
        import cupy

        out.append(("cupy", cupy.from_dlpack, lambda a: a.data.ptr, cupy.asnumpy))
    except ImportError:
        pass
    try:
        import torch

        out.append(("torch", torch.from_dlpack, lambda a: a.data_ptr(), lambda a: a.cpu().numpy()))
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("consumer", _dlpack_consumers(), ids=lambda c: c[0])
async def test_dlpack_consumer_shares_memory_in_order(consumer: Any) -> None:
    _, from_dlpack, pointer, to_numpy = consumer
    n = 1 << 20
    async with ac.open_client("cuda:0") as client:
        data = np.arange(n, dtype=np.float32)
        t = client.create_array(data)
        client.execute(SCALE, blocks(n), _scale(t, 1.0, n))
        await client.sync()
        assert t.__dlpack_device__() == (2, 0)
        for _ in range(20):  # on asynccube's stream; the consumer's stream must wait
            client.execute(SCALE, blocks(n), _scale(t, 2.0, n))
        while not client._channel.idle():  # noqa: ASYNC110 - see above
            await asyncio.sleep(0)
        address = t.__cuda_array_interface__["data"][0]
        array = from_dlpack(t)  # the consumer's stream waits for asynccube's
        assert pointer(array) == address  # no copy
        expected = data * 2.0**20
        np.testing.assert_array_equal(to_numpy(array), expected)
        del t
        gc.collect()
        await client.sync()
        others = [client.create_array(np.full(n, -1, np.float32)) for _ in range(4)]
        await client.sync()
        np.testing.assert_array_equal(to_numpy(array), expected)  # held: not reused
        assert len(others) == 4
        del array


async def test_bad_cuda_dlpack_requests_are_refused() -> None:
    async with ac.open_client("cuda:0") as client:
        t = client.create_array(np.zeros(4, np.float32))
        await client.sync()
        with pytest.raises(ac.DLPackError, match="stream=0"):
            t.__dlpack__(stream=0)
        with pytest.raises(ac.DLPackError, match="copy=True"):
            t.__dlpack__(copy=True)
        with pytest.raises(ac.DLPackError, match="another device"):
            t.__dlpack__(dl_device=(1, 0))
        assert "dltensor_versioned" in repr(t.__dlpack__(stream=-1, max_version=(1, 0)))
        torch = pytest.importorskip("torch")
        if torch.cuda.device_count() > 1:  # a stream of another GPU
            other = torch.cuda.Stream(device=1)
            with pytest.raises(ac.DLPackError, match="another device"):
                t.__dlpack__(stream=other.cuda_stream)
        assert (await client.read_array(t) == 0).all()  # still serving


async def test_torch_round_trip_without_copies() -> None:
    torch = pytest.importorskip("torch")
    n = 1 << 16
    async with ac.open_client("cuda:0") as client:
        before = await client.memory_usage()
        x = torch.arange(n, dtype=torch.float32, device="cuda")
        x.mul_(3.0)  # queued on torch's stream: ordered before asynccube's by the import
        t = client.from_dlpack(x)
        assert (t.shape, t.dtype) == ((n,), np.float32)
        client.execute(SCALE, blocks(n), _scale(t, 2.0, n))
        # A first launch may still wait on its compile (a queued command cannot be ordered
        # before a consumer, so export would refuse): let the actor submit it.
        while not client._channel.idle():  # noqa: ASYNC110 - the actor drains its queue
            await asyncio.sleep(0)
        back = torch.from_dlpack(t)  # ordered after the launch by an event, not a sync
        assert back.data_ptr() == x.data_ptr()  # torch -> asynccube -> torch: one buffer
        expected = np.arange(n, dtype=np.float32) * 6.0
        np.testing.assert_array_equal(back.cpu().numpy(), expected)
        assert (await client.memory_usage()).bytes_in_use == before.bytes_in_use


async def test_bad_cuda_imports_are_refused() -> None:
    torch = pytest.importorskip("torch")
    async with ac.open_client("cuda:0") as client:
        with pytest.raises(ac.DLPackError, match="not on this client"):
            client.from_dlpack(np.zeros(4, np.float32))
        strided = torch.zeros(8, device="cuda")[::2]
        with pytest.raises(ac.DLPackError, match="not C-contiguous"):
            client.from_dlpack(strided)
        assert (await client.read([client.create(b"ok")]))[0] == b"ok"
