"""Large copies on the host server leave the event loop free (issue 28, point 2).

Two detectors: the project's loop-lag probe (every test: no loop callback over 5 ms,
which catches a copy made on the loop), and a ticker here that measures how late a 1 ms
sleep wakes, minus the time the loop thread waited for a CPU (another process's doing),
which catches a worker thread holding the GIL through a copy (``tobytes``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.server.host_copies import BORROW_BYTES, new_bytes

from .kernels import NOOP

MIB = 1 << 20
CHUNK = 16 * MIB


class Ticker:
    """How late a 1 ms sleep wakes, net of the loop thread's run-queue wait."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self._stop = False
        self._task: asyncio.Task[None] | None = None
        self._fd: int | None = None

    def _queued(self) -> float:
        if self._fd is None:
            return 0.0
        return int(os.pread(self._fd, 96, 0).split()[1]) / 1e9

    async def _run(self) -> None:
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self._fd = None  # raw lateness: stricter
        while not self._stop:
            queued, start = self._queued(), time.perf_counter()
            await asyncio.sleep(0.001)
            late = time.perf_counter() - start - 0.001
            self.lags.append(late - (self._queued() - queued))
        if self._fd is not None:
            os.close(self._fd)

    async def __aenter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.005)  # a tick the last operation delayed
        self._stop = True
        assert self._task is not None
        await self._task

    def worst(self) -> float:
        """The latest wake-up, in seconds."""
        return max(self.lags, default=0.0)


async def _in_thread(fn: Any, *args: Any) -> Any:
    return await asyncio.to_thread(fn, *args)


def _all_equal(buf: Any, value: int) -> bool:
    """Every byte of ``buf`` is ``value`` (numpy, in chunks: the GIL is released)."""
    data = np.frombuffer(buf, np.uint8)
    return all(bool((data[i : i + CHUNK] == value).all()) for i in range(0, data.size, CHUNK))


def _fill(array: np.ndarray[Any, Any], value: int) -> None:
    for i in range(0, array.size, CHUNK):
        np.copyto(array[i : i + CHUNK], value)


def _same(a: Any, b: Any) -> bool:
    return np.array_equal(np.frombuffer(a, np.uint8), np.frombuffer(b, np.uint8))


async def _free(box: list[Any]) -> None:
    """Drop what ``box`` holds in a thread: freeing a large result takes milliseconds
    wherever it happens (the caller's own cost, not the server's)."""
    await _in_thread(box.clear)


def _pattern(n: int, seed: int) -> np.ndarray[Any, Any]:
    return (np.arange(n, dtype=np.uint32) * 2654435761 + seed).astype(np.uint8)


@pytest.mark.asyncio
async def test_64_mib_round_trip_passes_the_lag_probe(host_client: ac.ComputeClient) -> None:
    """create, write, read and read_array of 64 MiB: nothing is copied on the loop (the
    old client snapshot, 64 MiB copied by ``create``, took tens of milliseconds)."""
    n = 64 * MIB
    src = await _in_thread(_pattern, n, 1)
    t = host_client.create_array(src)
    again = await _in_thread(_pattern, n, 2)
    host_client.write([(t.copy_descriptor(), again)])
    (raw,) = await host_client.read([t.handle])
    assert type(raw) is bytes and len(raw) == n
    assert await _in_thread(_same, raw, again)
    got = await host_client.read_array(t)
    assert got.flags.writeable and got.dtype == np.uint8 and got.shape == (n,)
    assert await _in_thread(np.array_equal, got, again)
    box = [got, raw, src, again]
    del got, raw, src, again
    await _free(box)


@pytest.mark.asyncio
async def test_a_worker_read_does_not_hold_the_gil(host_client: ac.ComputeClient) -> None:
    """A 256 MiB read builds its ``bytes`` with the GIL released (``tobytes`` held it
    for the whole copy: the loop could not run for ~0.2 s)."""
    h = host_client.create(bytes(256 * MIB))  # bytes: taken by reference
    await host_client.sync()
    async with Ticker() as ticker:
        (raw,) = await host_client.read([h])
    assert len(raw) == 256 * MIB
    box = [raw]
    del raw
    await _free(box)
    assert ticker.worst() < 0.04, f"the loop waited {ticker.worst() * 1e3:.1f} ms"


@pytest.mark.asyncio
async def test_large_data_is_borrowed_and_written_in_stream_order(
    host_client: ac.ComputeClient,
) -> None:
    """Data of BORROW_BYTES or more is read by the worker when the stream reaches the
    write (the documented rule: unchanged until the write is done); a strided array
    is packed off the loop; smaller data is still copied at the call."""
    big = np.arange(2 * BORROW_BYTES // 4, dtype=np.float32).reshape(-1, 512)
    strided = big[:, ::2]  # not contiguous
    t = host_client.create_array(strided)
    assert t.shape == strided.shape and t.strides == (256, 1)
    np.testing.assert_array_equal(await host_client.read_array(t), strided)

    small = np.ones(BORROW_BYTES // 16, np.float64)
    hs = host_client.create(small)
    small[:] = 5  # after the call: must not leak in
    np.testing.assert_array_equal(await host_client.read_array(hs, np.float64), 1.0)


@pytest.mark.asyncio
async def test_a_captured_large_write_replays_the_captured_data(
    host_client: ac.ComputeClient,
) -> None:
    """A graph replays what large data was when it was captured, as for small data."""
    n = 2 * BORROW_BYTES
    h = host_client.empty(n)
    data = np.full(n, 3, np.uint8)
    async with host_client.capture() as graph:
        host_client.write([(h.copy_descriptor((n,), (1,), 1), data)])
        host_client.execute(NOOP, ac.CubeCount(1), ac.Bindings().with_buffers([h.binding()]))
    data[:] = 9
    graph.replay()
    got = await host_client.read_array(h, np.uint8)
    assert (got == 3).all()


def test_new_bytes_is_filled_in_place() -> None:
    for n in (0, 5, 5 * MIB):
        out, view = new_bytes(n)
        assert type(out) is bytes and len(out) == n and view.flags.writeable
        view[:] = 7
        assert out == bytes([7]) * n
        del view
        assert hash(out) == hash(bytes([7]) * n)


@pytest.mark.asyncio
@pytest.mark.slow
async def test_1_gib_round_trip_keeps_the_loop_free(host_client: ac.ComputeClient) -> None:
    """create, write, read and read_array of 1 GiB under the lag probe and the ticker
    (before: ``create`` of 1 GiB stalled the loop 2 s, a read ~0.7 s)."""
    n = 1 << 30
    src = await _in_thread(np.full, n, 3, np.uint8)
    async with Ticker() as ticker:
        t = host_client.create_array(src)
        await host_client.sync()
        await _in_thread(_fill, src, 4)
        host_client.write([(t.copy_descriptor(), src)])
        (raw,) = await host_client.read([t.handle])
        assert len(raw) == n
        assert await _in_thread(_all_equal, raw, 4)
        box = [raw]
        del raw
        await _free(box)
        got = await host_client.read_array(t)
        assert await _in_thread(_all_equal, got, 4)
        box = [got, src]
        del got, src
        await _free(box)
    assert ticker.worst() < 0.05, f"the loop waited {ticker.worst() * 1e3:.1f} ms"
