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


async def test_cai_right_after_queued_commands_is_ordered_after_them() -> None:
    n = 1 << 18  # 1 MiB: copied inline (a larger one is staged by a worker first)
    async with ac.open_client("cuda:0") as client:
        warm = client.create_array(np.zeros(n, np.float32))
        client.execute(SCALE, blocks(n), _scale(warm, 1.0, n))  # compiled and loaded now
        await client.sync()
        data = np.arange(n, dtype=np.float32)
        t = client.create_array(data)
        for _ in range(30):  # fire-and-forget, some still queued for the actor
            client.execute(SCALE, blocks(n), _scale(t, 1.0, n))
        client.execute(SCALE, blocks(n), _scale(t, 3.0, n))
        cai = t.__cuda_array_interface__  # no sync: the queued commands are issued first
        assert not client._channel._queue
        np.testing.assert_array_equal(_read_after(cai["data"][0], n, cai["stream"]), data * 3)


def _read_after(address: int, n: int, producer: int | None) -> np.ndarray[Any, Any]:
    """A consumer on a stream of its own (the raw driver): ordered after ``producer``'s
    work by an event (CAI), or by the export itself when ``producer`` is None (DLPack
    was given this consumer's stream: see _dlpack_to_driver), then copied to the host."""
    from asynccube._core.cuda.driver import check, cu

    d = cu()
    out = np.empty(n, np.float32)
    stream = check(d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    try:
        if producer is not None:
            event = check(d.cuEventCreate(0))
            check(d.cuEventRecord(event, producer))
            check(d.cuStreamWaitEvent(stream, event, 0))
            check(d.cuEventDestroy(event))
        check(d.cuMemcpyDtoHAsync(out.ctypes.data, address, out.nbytes, stream))
        check(d.cuStreamSynchronize(stream))
    finally:
        d.cuStreamDestroy(stream)
    return out


def _dlpack_to_driver(t: ac.Tensor, n: int) -> np.ndarray[Any, Any]:
    """The raw-driver consumer of a DLPack capsule: its stream is given to the export,
    which makes it wait for asynccube's work on the buffer; then it copies the data."""
    from asynccube._core.client.dlpack import take_capsule
    from asynccube._core.cuda.driver import check, cu

    d = cu()
    out = np.empty(n, np.float32)
    stream = check(d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    try:
        imported = take_capsule(t, int(stream))
        assert imported.shape == (n,) and imported.dtype == np.float32
        check(d.cuMemcpyDtoHAsync(out.ctypes.data, imported.address, out.nbytes, stream))
        check(d.cuStreamSynchronize(stream))
        del imported
    finally:
        d.cuStreamDestroy(stream)
    return out


def _any_dlpack_consumer() -> Any:
    """torch's or CuPy's ``from_dlpack`` (to numpy) where importable, else the driver."""
    for name in ("torch", "cupy"):
        try:
            module = __import__(name)
        except ImportError:
            continue
        if name == "torch":
            return lambda t, n: module.from_dlpack(t).cpu().numpy()
        return lambda t, n: module.asnumpy(module.from_dlpack(t))
    return _dlpack_to_driver


async def test_dlpack_export_right_after_execute_is_ordered_after_it() -> None:
    n = 1 << 18  # 1 MiB: copied inline (a larger one is staged by a worker first)
    consume = _any_dlpack_consumer()
    async with ac.open_client("cuda:0") as client:
        warm = client.create_array(np.zeros(n, np.float32))
        client.execute(SCALE, blocks(n), _scale(warm, 1.0, n))  # compiled and loaded now
        await client.sync()
        data = np.arange(n, dtype=np.float32)
        t = client.create_array(data)
        for _ in range(20):  # fire-and-forget, some still queued for the actor
            client.execute(SCALE, blocks(n), _scale(t, 2.0, n))
        np.testing.assert_array_equal(consume(t, n), data * 2.0**20)  # no sync
        t2 = client.create_array(data)
        client.execute(SCALE, blocks(n), _scale(t2, 3.0, n))
        np.testing.assert_array_equal(_dlpack_to_driver(t2, n), data * 3.0)


async def _dlpack_off_loop(t: ac.Tensor, n: int) -> np.ndarray[Any, Any]:
    """Like :func:`_dlpack_to_driver`, its export on the loop and its synchronization
    in a worker thread (the loop must run to issue a launch still waiting on its
    compile, which opens the gate the consumer's stream waits on)."""
    from asynccube._core.client.dlpack import take_capsule
    from asynccube._core.cuda.driver import check, cu

    d = cu()
    out = np.empty(n, np.float32)
    stream = check(d.cuStreamCreate(int(d.CUstream_flags.CU_STREAM_NON_BLOCKING)))
    try:
        imported = take_capsule(t, int(stream))

        address = imported.address

        def copy_out() -> None:  # a copy to pageable memory returns once it has run
            check(d.cuMemcpyDtoHAsync(out.ctypes.data, address, out.nbytes, stream))
            check(d.cuStreamSynchronize(stream))

        await asyncio.to_thread(copy_out)
        del imported
    finally:
        d.cuStreamDestroy(stream)
    return out


async def test_export_behind_a_first_compile_is_refused_with_the_reason() -> None:
    """An export behind a kernel's first launch (compiled and loaded in a worker thread)
    is refused at once, saying why: loading a module synchronizes the device, so a
    consumer's stream made to wait for the launch would hold the load (measured on an
    H200: such a wait held the load until the gate's watchdog, and the consumer read
    the bytes from before the launch). After one awaited call it is exported."""
    async with ac.open_client("cuda:0") as client:
        n = 1 << 10
        t = client.create_array(np.ones(n, np.float32))
        fresh = ac.Kernel("interop_fresh_scale", cuda=SCALE.cuda)  # not loaded yet
        client.execute(fresh, blocks(n), _scale(t, 2.0, n))  # waits on its load
        with pytest.raises(ac.DLPackError, match="compiled and loaded"):
            t.__dlpack__(stream=1)
        with pytest.raises(ac.DLPackError, match="compiled and loaded"):
            t.__cuda_array_interface__  # noqa: B018
        await client.sync()
        np.testing.assert_array_equal(await _dlpack_off_loop(t, n), 2.0)
        client.execute(fresh, blocks(n), _scale(t, 2.0, n))  # loaded: nothing to wait on
        np.testing.assert_array_equal(await _dlpack_off_loop(t, n), 4.0)


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
        warm = client.create_array(np.ones(n, np.float32))
        client.execute(SCALE, blocks(n), _scale(warm, 1.0, n))  # compiled and loaded now
        del warm
        await client.sync()
        before = await client.memory_usage()
        x = torch.arange(n, dtype=torch.float32, device="cuda")
        x.mul_(3.0)  # queued on torch's stream: ordered before asynccube's by the import
        t = client.from_dlpack(x)
        assert (t.shape, t.dtype) == ((n,), np.float32)
        client.execute(SCALE, blocks(n), _scale(t, 2.0, n))
        back = torch.from_dlpack(t)  # ordered after the launch on the device, no sync
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
            client.from_dlpack(strided, copy=False)
        assert (await client.read([client.create(b"ok")]))[0] == b"ok"


@pytest.mark.parametrize("side_stream", [False, True], ids=["default", "side"])
async def test_torch_import_is_ordered_after_torch_work(side_stream: bool) -> None:
    """The import asks torch for the legacy default stream (``stream=1``) and waits on
    the device for it: torch's work queued before the import, on its default stream or
    on a stream of its own (kept busy so that a missing wait would show), comes first."""
    torch = pytest.importorskip("torch")
    n = 1 << 20
    async with ac.open_client("cuda:0") as client:
        warm = client.create_array(np.ones(n, np.float32))
        client.execute(SCALE, blocks(n), _scale(warm, 1.0, n))  # compiled and loaded now
        del warm
        await client.sync()
        stream = torch.cuda.Stream() if side_stream else torch.cuda.default_stream()
        with torch.cuda.stream(stream):
            x = torch.zeros(n, dtype=torch.float32, device="cuda")
            torch.cuda._sleep(100_000_000)  # tens of ms on the producer's stream
            x.fill_(3.0)
            t = client.from_dlpack(x)
        client.execute(SCALE, blocks(n), _scale(t, 2.0, n))
        out = await client.read_array(t)
        np.testing.assert_array_equal(out, np.full(n, 6.0, np.float32))
        torch.cuda.synchronize()
