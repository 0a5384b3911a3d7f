"""``client.read_into``: a read into the caller's buffer, on every device and backend.

Into a ``bytearray``, a numpy array, a staging buffer (page-locked on CUDA: the device
writes into it, no host copy), small and large (a staged copy split over threads on
CUDA), a strided tensor; bad targets get InvalidArgument and the client keeps serving;
a tainted buffer is refused like a read. ``read_array`` goes through it on CUDA.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac

pytestmark = pytest.mark.anyio

SIZES = [4, 4096, 3 << 20]  # small, a page, over the 1 MiB copy split
DATA = {n: (np.arange(n, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8) for n in SIZES}
"""Bytes without a short period, made at import (3 MiB of them would lag the loop)."""
BIG = np.tile(DATA[3 << 20], 3)[: 8 << 20]
"""8 MiB of them (a large read's), made at import as well."""


@pytest.mark.parametrize("n", SIZES)
async def test_read_into_fills_the_callers_buffers(client: ac.ComputeClient, n: int) -> None:
    data = DATA[n]
    handle = client.create(data)
    out = bytearray(n)
    assert await client.read_into(handle, out) is None
    assert np.array_equal(np.frombuffer(out, np.uint8), data)
    array = np.zeros(n // 4, np.float32)
    await client.read_into(handle.binding(), array)
    assert np.array_equal(array.view(np.uint8), data)
    (staging,) = await client.staging([n])
    await client.read_into(handle, staging)
    assert np.array_equal(staging, data)


async def test_read_into_sees_the_work_queued_before_it(client: ac.ComputeClient) -> None:
    x = client.create_array(np.arange(1024, dtype=np.float32))
    y = client.empty_array((1024,), np.float32)
    client.write([(y.copy_descriptor(), np.full(1024, 7, np.float32))])
    out = np.empty(1024, np.float32)
    await client.read_into(y, out)
    assert (out == 7).all()
    await client.read_into(x, out)
    assert (out == np.arange(1024)).all()


async def test_read_into_packs_a_strided_tensor(client: ac.ComputeClient) -> None:
    full = np.arange(64, dtype=np.int32).reshape(8, 8)
    t = client.create_array(full)
    column = client.tensor(t.handle, (8,), np.int32, strides=(8,))
    out = np.empty(8, np.int32)
    await client.read_into(column, out)
    assert (out == full[:, 0]).all()
    desc = t.handle.copy_descriptor((4, 2), (8, 1), 4)
    packed = np.empty((4, 2), np.int32)
    await client.read_into(desc, packed)
    assert (packed == full[:4, :2]).all()


@pytest.mark.parametrize(
    ("target", "words"),
    [
        (bytes(16), "read-only"),
        (bytearray(15), "holds 15 bytes but the tensor has 16"),
        (np.zeros((4, 8), np.uint8)[:, :4], "not contiguous"),
        (object(), "needs a writable buffer"),
        ([0] * 16, "needs a writable buffer"),
    ],
    ids=["bytes", "short", "strided", "object", "list"],
)
async def test_a_bad_target_is_refused_and_the_client_serves(
    client: ac.ComputeClient, target: Any, words: str
) -> None:
    handle = client.create(bytes(range(16)))
    with pytest.raises(ac.InvalidArgument, match=words):
        client.read_into(handle, target)
    out = bytearray(16)
    await client.read_into(handle, out)
    assert out == bytes(range(16))


async def test_read_into_a_tainted_buffer_raises(client: ac.ComputeClient) -> None:
    def boom(launch: ac.HostLaunch) -> None:
        raise RuntimeError("kernel failed on purpose")

    src = 'extern "C" __global__ void boom(float* x) { asm("trap;"); }'
    kernel = ac.Kernel("test_read_into_boom", cuda=ac.CudaSource(src, "boom"), host=boom)
    if client.device != "host":
        pytest.skip("a trapping kernel ends the CUDA context; the host checks the rule")
    handle = client.create(bytes(16))
    client.execute(kernel, ac.CubeCount(1), ac.Bindings().with_buffers([handle.binding()]))
    with pytest.raises(ac.AsyncCubeError):
        await client.sync()
    with pytest.raises(ac.TaintedBuffer):
        await client.read_into(handle, bytearray(16))
    client.write([(handle.copy_descriptor((16,), (1,), 1), bytes(range(16)))])
    out = bytearray(16)
    await client.read_into(handle, out)
    assert out == bytes(range(16))


async def test_read_array_gives_a_new_array_of_the_tensor(client: ac.ComputeClient) -> None:
    data = np.arange(3 << 18, dtype=np.float32).reshape(3, -1)
    t = client.create_array(data)
    got = await client.read_array(t)
    assert got.shape == data.shape and got.dtype == data.dtype and (got == data).all()
    got[0, 0] = -1  # the caller owns it
    assert (await client.read_array(t))[0, 0] == 0


@pytest.mark.cuda
async def test_a_large_read_outlives_its_client() -> None:
    """A read of 1 MiB or more comes back over pinned memory (no copy); the memory is
    the CUDA context's, so the context is released only once the result is dropped:
    reading it after the client closed sees the bytes, and does not crash."""
    data = DATA[3 << 20]
    async with ac.open_client("cuda:0") as gpu:
        (kept,) = await gpu.read([gpu.create(data)])
    assert np.array_equal(np.frombuffer(kept, np.uint8), data)
    del kept
    async with ac.open_client("cuda:0") as gpu:  # the context comes back for the next
        assert await gpu.read([gpu.create(b"ok")]) == [b"ok"]


@pytest.mark.cuda
async def test_page_locked_data_is_written_without_a_host_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large page-locked data that is not a staging buffer itself (a view of one here;
    torch's ``pin_memory`` in practice) is borrowed and copied by the device straight
    from where it is, even when a free pinned buffer of its size would take a copy."""
    from asynccube._core.cuda import transfers

    copies: list[int] = []
    real = transfers.hot.copy_into

    def counted(*args: Any) -> Any:
        copies.append(1)
        return real(*args)

    n = 3 << 20
    async with ac.open_client("cuda:0") as gpu:
        (back,) = await gpu.read([gpu.create(DATA[n])])  # over a pinned buffer of n bytes
        del back  # now free: a snapshot could take it
        buf, out = await gpu.staging([n + 4096, n])
        view = buf[4096:]  # page-locked, but not an array that staging() returned
        view[:] = DATA[n]
        monkeypatch.setattr(transfers.hot, "copy_into", counted)
        handle = gpu.create(view)
        await gpu.read_into(handle, out)
        monkeypatch.undo()
    assert np.array_equal(out, DATA[n])
    assert copies == []


@pytest.mark.cuda
async def test_large_reads_into_new_arrays_copy_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``read_array`` of 8 MiB (the two-GPU all_reduce test reads two): the copy out of
    its staging buffer runs in a worker thread, not on the loop (8.8 ms there under the
    GPU suite's load), and the new array holds the bytes; below ``OFF_LOOP_COPY`` the
    copy stays on the loop (shorter than the thread hop)."""
    import threading

    from asynccube._core.cuda import transfers

    on_loop = threading.get_ident()
    threads: list[int] = []
    real = transfers.hot.copy_into

    def recorded(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args)

    data = BIG
    async with ac.open_client("cuda:0") as gpu:
        handle = gpu.create(data)
        monkeypatch.setattr(transfers.hot, "copy_into", recorded)
        array = await gpu.read_array(handle, np.uint8)
        assert threads and on_loop not in threads, threads
        threads.clear()
        half = transfers.OFF_LOOP_COPY // 2
        small = gpu.create(data[:half])  # (its body is staged by copy_into too, here)
        threads.clear()
        part = await gpu.read_array(small, np.uint8)
        assert threads == [on_loop], threads
        monkeypatch.undo()
    same = await anyio.to_thread.run_sync(np.array_equal, array, data)  # 8 MiB: off the loop
    assert same and np.array_equal(part, data[:half])


_KEPT_TO_EXIT = """
import asyncio
import asynccube as ac

KEPT = []

async def main() -> None:
    async with ac.open_client("cuda:0") as gpu:
        KEPT.extend(await gpu.staging([1 << 20, 4 << 20]))
        (big,) = await gpu.read([gpu.create(bytes(2 << 20))])  # over pinned memory
        KEPT.append(big)

asyncio.run(main())
print("done")
"""


@pytest.mark.cuda
def test_pinned_memory_kept_until_the_interpreter_exits_is_freed_quietly() -> None:
    """Staging buffers and a large read's result that a module keeps are freed at
    interpreter shutdown, after their client closed: the context's deferred release
    then runs without a thread (none can start), with nothing printed."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _KEPT_TO_EXIT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "done"
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
