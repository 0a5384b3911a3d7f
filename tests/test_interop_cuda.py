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
                "torch",
                lambda t: torch.as_tensor(t, device="cuda"),
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


async def test_dlpack_on_cuda_is_refused_with_a_pointer_to_cai() -> None:
    async with ac.open_client("cuda:0") as client:
        t = client.create_array(np.zeros(4, np.float32))
        await client.sync()
        assert t.__dlpack_device__() == (2, 0)
        with pytest.raises(ac.DLPackError, match="__cuda_array_interface__"):
            t.__dlpack__()
        await client.sync()
