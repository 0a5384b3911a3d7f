"""Scenarios of the one-call launch route (``cuda/fast.py``) on the real client ->
channel -> CudaServer path against the no-op driver of ``benchmarks/bench_overhead.py``.

Run in its own process by ``tests/test_fast_launch.py`` (the fake driver is loaded into
the process for good): ``python tests/fast_launch_scenario.py NAME``; prints ``ok NAME``
or raises. ``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_overhead

bench_overhead.install_fake()

import asynccube as ac  # noqa: E402
from asynccube._core.client.client import ComputeClient  # noqa: E402
from asynccube._core.cuda.native.hotpath import ACTIVE  # noqa: E402
from asynccube._core.cuda.transfers import SMALL_WRITE  # noqa: E402
from asynccube._core.profiling.records import KernelRecorder, ProfilingLevel  # noqa: E402
from asynccube._core.testing.ticks import loop_ticks  # noqa: E402
from tasks import actor_idle  # noqa: E402

ADD = ac.Kernel("fl_add", cuda=ac.CudaSource(bench_overhead.ADD, "add", (256, 1, 1)))
EMPTY = ac.Kernel("fl_empty", cuda=ac.CudaSource(bench_overhead.ADD, "empty_kernel", (1, 1, 1)))
N = 4096
U, C = ac.ExecutionMode.UNCHECKED, ac.ExecutionMode.CHECKED
GROUPS = r"""
extern "C" __global__ void four(float* x, double d, float a, int i, unsigned n) {}
extern "C" __global__ void five(float* x, double d, float a, long long q, int i, unsigned n) {}
"""
FOUR = ac.Kernel("fl_four", cuda=ac.CudaSource(GROUPS, "four", (256, 1, 1)))
FIVE = ac.Kernel("fl_five", cuda=ac.CudaSource(GROUPS, "five", (256, 1, 1)))


class Setup:
    """A client on the fake server, three buffers bound to the add kernel, loaded."""

    @staticmethod
    async def failure(
        awaitable: Awaitable[object], kind: type[BaseException]
    ) -> BaseException | None:
        """What awaiting ``awaitable`` raised of ``kind`` (None: it returned)."""
        try:
            await awaitable
        except kind as exc:
            return exc
        return None

    def __init__(self, recorder: KernelRecorder | None = None, batch_seconds: float = 1e-3) -> None:
        self.server = bench_overhead._server()
        if recorder is not None:
            self.server.recorder = recorder
        loop = asyncio.get_running_loop()
        self.client = ComputeClient(self.server, loop, batch_seconds=batch_seconds)
        self.handles = [self.client.empty(4 * N) for _ in range(3)]
        self.bindings = (
            ac.Bindings()
            .with_buffers([h.binding() for h in self.handles])
            .with_scalar(np.uint32, [N])
        )
        self.count = ac.CubeCount(N // 256)

    async def ready(self) -> Setup:
        self.client.execute(ADD, self.count, self.bindings)  # compiles, loads, checks
        await self.client.sync()
        await actor_idle(self.client)
        return self

    @property
    def stats(self) -> tuple[int, int]:
        fast = self.client._fast
        assert fast is not None, "a CUDA client has a FastLaunch"
        hits, declined = fast.stats
        return int(hits), int(declined)

    def rewrite(self) -> None:
        """Write the three buffers again: a failed launch left them carrying its failure
        (a launch binding one would be skipped)."""
        zeros = bytes(4 * N)
        self.client.write([(h.copy_descriptor((N,), (1,), 4), zeros) for h in self.handles])

    def writing_to(self, out: ac.Handle) -> ac.Bindings:
        """The add kernel's bindings with ``out`` as its output buffer."""
        b = ac.Bindings().with_buffers([*self.bindings.buffers[:2], out.binding()])
        return b.with_scalar(np.uint32, [N])

    def stamp(self, i: int = 0) -> tuple[Any, int]:
        mid = self.handles[i].binding().memory.id
        return self.server._streams.last_use[mid]  # type: ignore[no-any-return]


async def taken() -> None:
    """Plain launches are taken, and do the route's bookkeeping."""
    s = await Setup().ready()
    hits, declined = s.stats
    sid, cursor = s.stamp()
    for _ in range(10):
        s.client.execute(ADD, s.count, s.bindings, U)
        s.client.execute(ADD, s.count, s.bindings)  # CHECKED, the grid already checked
    assert s.stats == (hits + 20, declined), s.stats
    new_sid, new_cursor = s.stamp()
    assert new_sid == sid and new_cursor == cursor + 20, (sid, cursor, new_sid, new_cursor)
    await s.client.sync()
    await s.client.close()


async def declined() -> None:
    """What the route must handle goes there, and works."""
    s = await Setup().ready()
    counts = s.client.create(np.array([2, 1, 1], np.uint32).tobytes())
    dynamic = ac.CubeCount.dynamic(counts.binding())
    _, d0 = s.stats
    s.client.execute(ADD, ac.CubeCount(N // 128), s.bindings)  # CHECKED, a new grid
    assert s.stats[1] == d0 + 1, s.stats
    s.client.execute(ADD, ac.CubeCount(N // 128), s.bindings)  # now it is known good
    assert s.stats[1] == d0 + 1, s.stats
    s.client.execute(ADD, dynamic, s.bindings, U)  # a count read back first (0s here)
    assert s.stats[1] == d0 + 2, s.stats
    await s.client.sync()
    await s.client.close()


async def scalar_dtype() -> None:
    """Each scalar dtype has its own signature: a wider one is the route's (it raises,
    every time); another of the same size is checked once, then taken; so is the first."""
    s = await Setup().ready()
    buffers = [h.binding() for h in s.handles]
    wide = ac.Bindings().with_buffers(buffers).with_scalar(np.uint64, [N])
    same = ac.Bindings().with_buffers(buffers).with_scalar(np.float32, [1.0])
    hits, d0 = s.stats
    for _ in range(2):
        s.client.execute(ADD, s.count, wide)
        raised = await Setup.failure(s.client.sync(), ac.InvalidArgument)
        if raised is None or "[8, 8, 8, 8]" not in str(raised):
            raise AssertionError(f"an 8-byte scalar for a 4-byte one was not raised: {raised!r}")
        s.rewrite()
    assert s.stats == (hits, d0 + 2), s.stats
    s.client.execute(ADD, s.count, same)  # a new signature: the route checks it
    s.client.execute(ADD, s.count, same)
    s.client.execute(ADD, s.count, s.bindings)
    assert s.stats == (hits + 2, d0 + 3), s.stats
    await s.client.sync()
    await s.client.close()


async def scalar_groups() -> None:
    """Several scalar dtypes, bound out of ABI order, are taken too (up to four), packed
    as the route packs them (ABI order: float64, float32, ..., int32, uint32); a fifth
    dtype is the route's."""
    s = await Setup().ready()
    x = s.handles[0].binding()

    def four(d: float, a: float, i: int, n: int) -> ac.Bindings:
        b = ac.Bindings().with_buffer(x).with_scalar(np.uint32, [n]).with_scalar(np.int32, [i])
        return b.with_scalar(np.float32, [a]).with_scalar(np.float64, [d])

    s.client.execute(FOUR, s.count, four(1.0, 2.0, 3, 4))  # the route loads and checks it
    await s.client.sync()
    hits, d0 = s.stats
    s.client.execute(FOUR, s.count, four(0.25, -1.5, -7, 77))
    assert s.stats == (hits + 1, d0), s.stats
    (pack,) = [p for p in s.server._packer._packs.values() if len(p.signature.scalars) == 4]
    got = [pack.param_bytes(i, size) for i, size in ((1, 8), (2, 4), (3, 4), (4, 4))]
    want = [np.float64(0.25), np.float32(-1.5), np.int32(-7), np.uint32(77)]
    assert got == [v.tobytes() for v in want], got
    five = four(1.0, 2.0, 3, 4).with_scalar(np.int64, [5])
    s.client.execute(FIVE, s.count, five)
    s.client.execute(FIVE, s.count, five)
    assert s.stats == (hits + 1, d0 + 2), s.stats
    await s.client.sync()
    await s.client.close()


async def other_stream() -> None:
    """A buffer last used on another task's stream: the route syncs the streams."""
    s = await Setup().ready()
    _, d0 = s.stats
    main_sid, _ = s.stamp()

    async def other() -> Any:
        s.client.execute(ADD, s.count, s.bindings, U)
        return ac.StreamId.current()

    other_sid = await asyncio.create_task(other())
    assert other_sid != main_sid
    assert s.stats[1] == d0 + 1, s.stats  # declined: the buffers came from main's stream
    assert s.stamp()[0] == other_sid
    s.client.execute(ADD, s.count, s.bindings, U)  # and back: declined again
    assert s.stats[1] == d0 + 2, s.stats
    assert s.stamp()[0] == main_sid
    await s.client.sync()
    await s.client.close()


async def new_task() -> None:
    """A task's first launch (its stream minted, the stream created) is taken."""
    s = await Setup().ready()
    one, nothing = ac.CubeCount(1), ac.Bindings()
    s.client.execute(EMPTY, one, nothing)  # loaded and checked
    await s.client.sync()
    hits, d0 = s.stats
    slots = s.server._streams.streams.slots
    before = sum(w is not None for w in slots)

    async def first() -> Any:
        s.client.execute(EMPTY, one, nothing, U)
        s.client.execute(EMPTY, one, nothing, U)
        return ac.StreamId.current()

    sid = await asyncio.create_task(first())
    assert s.stats == (hits + 2, d0), s.stats
    assert sum(w is not None for w in slots) == before + 1, "its stream was created"
    assert slots[sid.value % s.server._streams.max_streams].cursor == 2
    await s.client.sync()
    await s.client.close()


async def launch_error() -> None:
    """A failed cuLaunchKernel is held for the stream, raised by the next awaited
    command, taints the launch's buffers, and the client keeps serving."""
    s = await Setup().ready()
    bad = ac.CubeCount(777)
    s.client.execute(ADD, bad, s.bindings, U)
    hits, _ = s.stats
    raised = await Setup.failure(s.client.sync(), ac.DeviceError)  # a CudaDriverError
    if raised is None or "cuLaunchKernel(fl_add)" not in str(raised):
        raise AssertionError(f"the failed launch was not raised: {raised!r}")
    try:  # its buffers carry the failure (issue 40), raised with the root's type
        await s.client.read([s.handles[2]])
    except ac.DeviceError as exc:
        if not isinstance(exc, ac.TaintedBuffer) or "cuLaunchKernel(fl_add)" not in str(exc):
            raise
    else:
        raise AssertionError("the failed launch left its buffers untainted")
    s.rewrite()  # else the next launch is skipped
    s.client.execute(ADD, s.count, s.bindings, U)
    await s.client.sync()
    assert s.stats[0] == hits + 1, s.stats
    await s.client.close()


async def foreign_handle() -> None:
    """Another client's handle is declined by the fast route and refused at the call by
    the route with its typed error (issue 37): never launched, nothing held or tainted."""
    s = await Setup().ready()
    other = await Setup().ready()
    b = ac.Bindings().with_buffers([other.handles[0].binding(), *s.bindings.buffers[1:]])
    b.with_scalar(np.uint32, [N])
    hits, d0 = s.stats
    try:
        s.client.execute(ADD, s.count, b, U)
    except ac.InvalidHandle:
        pass
    else:
        raise AssertionError("a launch on another client's handle was not refused")
    assert s.stats == (hits, d0 + 1), s.stats
    assert not s.client._channel._held._tainted
    await s.client.sync()  # nothing held
    s.client.execute(ADD, s.count, s.bindings, U)  # still serving, on the fast route
    await s.client.sync()
    assert s.stats[0] == hits + 1, s.stats
    await other.client.close()
    await s.client.close()


async def zero_count() -> None:
    """A CHECKED launch of zero cubes is declined by the fast route and refused at the
    call by the route (issue 37): nothing held; an UNCHECKED one is taken and launches
    nothing, as the route's would."""
    s = await Setup().ready()
    hits, d0 = s.stats
    for dims in ((0, 1, 1), (1, 0, 1), (1, 1, 0)):
        refused = ""
        try:
            s.client.execute(ADD, ac.CubeCount(*dims), s.bindings)
        except ac.InvalidArgument as exc:
            refused = str(exc)
        assert "zero dimension" in refused, f"a CHECKED launch of {dims} cubes: {refused!r}"
    assert s.stats == (hits, d0 + 3), s.stats
    await s.client.sync()  # nothing held
    s.client.execute(ADD, ac.CubeCount(0), s.bindings, U)
    assert s.stats == (hits + 1, d0 + 3), s.stats
    await s.client.sync()
    await s.client.close()


async def read_tensor_item() -> None:
    """``read([tensor])``: the fast read declines a Tensor, the route reads its elements
    (issue 37)."""
    s = await Setup().ready()
    t = s.client.create_array(np.arange(8, dtype=np.uint8))
    _, d0 = s.stats
    data = await s.client.read([t])
    assert len(data) == 1 and len(data[0]) == 8, data  # the fake driver copies nothing
    assert s.stats[1] == d0 + 1, s.stats
    await s.client.close()


async def read_taken() -> None:
    """A small read of one buffer is taken once a spare buffer of its size exists, and
    its future is done before it is awaited."""
    s = await Setup().ready()
    h = s.client.create(bytes(range(256)) * 4)
    await s.client.read([h])  # the route, which keeps a spare buffer of this size
    hits, d0 = s.stats
    for _ in range(5):
        fut = s.client.read([h])
        assert fut.done(), "a short read is done before its caller suspends"
        (data,) = await fut
        assert len(data) == 1024
    assert s.stats == (hits + 5, d0), s.stats
    big = s.client.empty(128 << 10)
    await s.client.read([big])
    await s.client.read([big])
    # above SMALL_READ: the route (and the empty, with no dropped slice to take)
    assert s.stats == (hits + 5, d0 + 3), s.stats
    await s.client.close()


async def read_declined() -> None:
    """A held error, or a buffer last used on another task's stream: the route."""
    s = await Setup().ready()
    h = s.handles[0]
    await s.client.read([h])
    hits, d0 = s.stats
    s.client.execute(ADD, ac.CubeCount(777), s.bindings, U)  # fails: held for the stream
    raised = await Setup.failure(s.client.read([h]), ac.DeviceError)
    assert raised is not None and "cuLaunchKernel" in str(raised), raised
    assert s.stats == (hits + 1, d0 + 1), s.stats  # the launch taken, the read declined
    s.rewrite()  # the failed launch's buffers carry its failure (issue 40)

    async def other() -> None:
        s.client.execute(ADD, s.count, s.bindings, U)

    await asyncio.create_task(other())
    await s.client.read([h])  # h was last used on the other task's stream
    assert s.stats[1] == d0 + 3, s.stats  # (the other task's launch was declined too)
    await s.client.read([h])
    assert s.stats[1] == d0 + 3, s.stats  # back on this stream: taken
    await s.client.close()


async def read_error() -> None:
    """A failed copy fails the future with the driver's typed error; the client serves on."""
    s = await Setup().ready()
    h = s.handles[1]
    await s.client.read([h])
    flag = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_fail_dtoh")
    flag.value = 1  # CUDA_ERROR_INVALID_VALUE
    hits, _ = s.stats
    raised: BaseException | None = None
    try:
        await s.client.read([h])
    except ac.DeviceError as exc:
        raised = exc
    finally:
        flag.value = 0
    assert raised is not None and "cuMemcpyDtoHAsync" in str(raised), raised
    assert s.stats[0] == hits + 1, s.stats
    assert len((await s.client.read([h]))[0]) == 4 * N
    await s.client.close()


async def sync_wakes_once() -> None:
    """Issue 38: awaiting a sync the device is done with suspends exactly once (the
    caller is woken in the next loop iteration, not the one after), behind a task
    cancelled just before it; on FastSync and on the route that settles it inline (a
    held error)."""
    s = await Setup().ready()
    fast = s.client._fast_sync
    hits = fast.hits
    count, stop = loop_ticks()
    for _ in range(20):
        blocked = asyncio.ensure_future(asyncio.sleep(3600))
        await asyncio.sleep(0)  # it waits in its sleep
        s.client.execute(ADD, s.count, s.bindings, U)
        blocked.cancel()
        before = count[0]
        await s.client.sync()
        assert count[0] - before == 1, f"woken after {count[0] - before} loop iterations"
        assert blocked.cancelled(), "the task cancelled before the sync has ended"
    assert fast.hits == hits + 20
    s.client.execute(ADD, ac.CubeCount(777), s.bindings, U)  # fails: held, the route's sync
    before = count[0]
    raised = await Setup.failure(s.client.sync(), ac.DeviceError)
    assert raised is not None and "cuLaunchKernel" in str(raised), raised
    assert count[0] - before == 1, f"the route: woken after {count[0] - before} iterations"
    assert fast.hits == hits + 20
    stop()
    await asyncio.sleep(0)
    await s.client.close()


async def wait_taken() -> None:
    """Issue 38: ``client.wait`` on another library's stream whose work is done within the
    spin is settled in one call (``FastSync.foreign``: a done future, the capture given
    back); the device still busy past the spin, or a held error: the route (which waits,
    or raises the error first)."""
    s = await Setup().ready()
    fast, pool = s.client._fast_sync, s.server._events
    hits = fast.foreign_hits
    fut = s.client.wait(0x5000)
    assert fut.done(), "settled in the call"
    await fut
    free = len(pool._free)
    await s.client.wait(0x5000)
    assert fast.foreign_hits == hits + 2 and len(pool._free) == free, "the capture is back"
    flag = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_pending")
    flag.value = 1  # the device is slower than the host: event queries say not ready
    fut = s.client.wait(0x5000)
    assert not fut.done() and fast.foreign_hits == hits + 2, "declined: the route waits"
    flag.value = 0
    await fut
    s.client.execute(ADD, ac.CubeCount(777), s.bindings, U)  # fails: held for the stream
    raised = await Setup.failure(s.client.wait(0x5000), ac.DeviceError)
    assert raised is not None and "cuLaunchKernel" in str(raised), raised
    assert fast.foreign_hits == hits + 2
    await s.client.wait(0x5000)
    assert fast.foreign_hits == hits + 3
    await s.client.close()


async def spins_once() -> None:
    """A sync or a wait whose work outlasts FastSync's spin goes to the route, whose
    watcher does not spin again (one 30 µs spin on the loop, not two), and skips its
    next spins as after one of its own that ran out. The sync's spin is its poll in the
    next loop iteration (see ``sync_overlapped``), which hands it to the route."""
    from asynccube._core.channel.completion import SPIN_BACKOFF

    s = await Setup().ready()
    fast, watcher = s.client._fast_sync, s.client._channel.watcher
    flag = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_pending")
    for sync in (True, False):
        hits, spins, handed = (fast.hits, fast.foreign_hits), watcher.spins, fast.handed
        s.client.execute(ADD, s.count, s.bindings, U)
        flag.value = 1  # the device is slower than the host: queries say not ready
        fut = s.client.sync() if sync else s.client.wait(0x5000)
        assert not fut.done() and (fast.hits, fast.foreign_hits) == hits, "declined"
        if sync:
            await asyncio.sleep(0)  # its poll ran out: handed to the route
            assert not fut.done() and fast.handed == handed + 1, "handed to the route"
        assert watcher.spins == spins, "the route did not spin again"
        # (the wait's route skipped one spin of its own; the sync's is watched unspun)
        assert watcher._skip_spins == SPIN_BACKOFF - (not sync), watcher._skip_spins
        flag.value = 0
        await fut
        watcher._skip_spins = 0
    await s.client.close()


async def sync_overlapped() -> None:
    """Issue 38: a sync whose streams are still busy at the call is polled in the loop
    iteration that wakes its caller, behind the callbacks queued before it (a task
    cancelled before the sync has unwound when it returns) and before those queued in
    that iteration (the caller resumes there: one suspension); done, no route. One not
    done by then, or never awaited, or still waiting when the server closes, goes to the
    route, whose completion settles it; a cancelled one is dropped."""
    s = await Setup().ready()
    fast, loop = s.client._fast_sync, asyncio.get_running_loop()
    flag = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_pending")
    seen: list[str] = []

    def first() -> None:  # queued before the sync: runs before it returns
        seen.append("first")
        loop.call_soon(seen.append, "next")  # queued in the waking iteration: after it

    hits, over, handed = fast.hits, fast.overlapped, fast.handed
    blocked = asyncio.ensure_future(asyncio.sleep(3600))
    await asyncio.sleep(0)  # it waits in its sleep
    s.client.execute(ADD, s.count, s.bindings, U)
    blocked.cancel()
    loop.call_soon(first)
    flag.value = 1  # busy at the call
    fut = s.client.sync()
    assert not fut.done() and fast.hits == hits, "polled later"
    flag.value = 0  # done by the next iteration
    await fut
    assert seen == ["first"], f"woken in the iteration after the call, not later: {seen}"
    assert blocked.cancelled(), "the task cancelled before the sync has ended"
    assert (fast.hits, fast.overlapped, fast.handed) == (hits + 1, over + 1, handed)
    assert fut not in s.client._channel._pending
    # a handle dropped before the sync is free after it
    before = await s.client.memory_usage()
    h = s.client.create(np.ones(N, np.float32))
    s.client.execute(ADD, s.count, ac.Bindings().with_buffers([h.binding()] * 3)
                     .with_scalar(np.uint32, [N]), U)  # fmt: skip
    del h
    flag.value = 1
    fut = s.client.sync()
    flag.value = 0
    await fut
    after = await s.client.memory_usage()
    assert after.bytes_in_use == before.bytes_in_use, (before, after)
    # cancelled while it waits: nothing settles it, nothing is handed over
    s.client.execute(ADD, s.count, s.bindings, U)
    flag.value = 1
    fut = s.client.sync()
    fut.cancel()
    await asyncio.sleep(0)
    flag.value = 0
    assert fut.cancelled() and fast.handed == handed and fut not in s.client._channel._pending
    # a poll that raises fails the sync with its error: nothing hangs
    from asynccube._core.cuda import fast_sync

    s.client.execute(ADD, s.count, s.bindings, U)
    flag.value = 1
    fut = s.client.sync()
    flag.value = 0
    real = fast_sync._all_done

    def broken(marks: Any, spin: float) -> int:
        raise ac.DeviceError("the poll broke")

    fast_sync._all_done = broken  # type: ignore[assignment]
    try:
        raised = await Setup.failure(fut, ac.DeviceError)
    finally:
        fast_sync._all_done = real  # type: ignore[assignment]
    assert raised is not None and "the poll broke" in str(raised), raised
    assert fut not in s.client._channel._pending
    await s.client.sync()  # the client serves on
    # still waiting when the server closes: handed to the route first
    s.client.execute(ADD, s.count, s.bindings, U)
    flag.value = 1
    fut = s.client.sync()
    for hook in s.server.before_close:
        hook()
    assert fast.handed == handed + 1 and not fut.done()
    await asyncio.sleep(0)  # its poll finds it handed over: nothing more
    assert fast.handed == handed + 1 and fast.overlapped == over + 2
    flag.value = 0
    await fut
    await s.client.close()


async def under_trio() -> None:
    """Under trio (its own thread here) FastSync takes a sync, settled from a callback
    (not at once, not as the awaiting task suspends: see ``completion.settle_soon``), and
    a wait on another library's stream."""
    import trio

    from asynccube._core.channel.backend import current_backend
    from asynccube._core.channel.completion import LaterFuture

    async def main() -> None:
        client = ComputeClient(bench_overhead._server(), current_backend("test").loop)
        one, none = ac.CubeCount(1), ac.Bindings()
        client.execute(EMPTY, one, none)
        await client.sync()
        fast = client._fast_sync
        hits = fast.hits
        await actor_idle(client)
        client.execute(EMPTY, one, none, U)
        fut = client.sync()
        assert not isinstance(fut, LaterFuture) and not fut.done()
        await fut
        assert fast.hits == hits + 1
        fut = client.wait(0x5000)
        assert fut.done() and fast.foreign_hits == 1
        await fut
        await client.close()

    await asyncio.to_thread(trio.run, main)


async def sync_taken() -> None:
    """A sync after short work is settled one loop step later (not by the route); a
    held error takes the route."""
    s = await Setup().ready()
    fast = s.client._fast_sync
    hits, declined = fast.hits, fast.declined
    s.client.execute(ADD, s.count, s.bindings, U)
    fut = s.client.sync()
    # Never at once, even with nothing else ready (issue 37, point 10): the loop holds
    # the callback that resumed this task (a gather's errors, their frames' handles)
    # until the task suspends.
    assert not fut.done(), "settled one step later, even with nothing else ready"
    await fut
    s.client.execute(ADD, s.count, s.bindings, U)
    asyncio.get_running_loop().call_soon(lambda: None)  # another task's wake-up, say
    fut = s.client.sync()
    assert not fut.done(), "settled one step later: tasks cancelled before it unwind first"
    await asyncio.sleep(0)
    assert fut.done(), "the device was done: the sync is settled in the next loop step"
    await fut
    assert (fast.hits, fast.declined) == (hits + 2, declined)
    s.client.execute(ADD, ac.CubeCount(777), s.bindings, U)  # fails: held
    raised = await Setup.failure(s.client.sync(), ac.DeviceError)
    assert raised is not None and "cuLaunchKernel" in str(raised), raised
    assert (fast.hits, fast.declined) == (hits + 2, declined + 1)
    await s.client.sync()
    assert fast.hits == hits + 3
    await s.client.close()


async def queued() -> None:
    """Launches that wait for the actor (the budget spent: commands queue) are taken by
    ``queued`` when the actor runs them, with the route's bookkeeping; a new grid under
    CHECKED is left to the route; a failed launch is held for its stream."""
    s = await Setup(batch_seconds=1e-6).ready()
    fast = s.client._fast
    q0, qd0 = fast.queued_stats
    sid, cursor = s.stamp()
    s.client.create(bytes(16))  # inline: the budget of this loop iteration is spent
    s.client.create(bytes(16))  # queued, and every command after it
    for _ in range(10):
        s.client.execute(ADD, s.count, s.bindings, U)
    s.client.execute(ADD, ac.CubeCount(N // 128), s.bindings)  # CHECKED, a new grid
    assert fast.queued_stats == (q0, qd0), "nothing ran before the actor"
    await s.client.sync()
    assert fast.queued_stats == (q0 + 10, qd0 + 1), fast.queued_stats
    new_sid, new_cursor = s.stamp()
    # stamped on the task's stream, past the 11 launches (the creates move the cursor too)
    assert new_sid == sid and new_cursor >= cursor + 11, (sid, cursor, new_sid, new_cursor)
    s.client.create(bytes(16))
    s.client.create(bytes(16))
    s.client.execute(ADD, ac.CubeCount(777), s.bindings, U)  # the fake driver fails it
    raised = await Setup.failure(s.client.sync(), ac.DeviceError)
    assert raised is not None and "cuLaunchKernel(fl_add)" in str(raised), raised
    assert fast.queued_stats == (q0 + 11, qd0 + 1), fast.queued_stats
    await s.client.sync()
    await s.client.close()


async def first_use() -> None:
    """A buffer no route has used yet (its address not cached: a new handle) has it found
    through ``set_pointers``: a caller's launch, a queued one and a small read of a
    Handle alike; when that raises an Exception, the launch is left to the route;
    anything else (a KeyboardInterrupt) propagates."""
    s = await Setup().ready()
    addresses = s.server._addresses
    fast = s.client._fast
    out = s.client.empty(4 * N)  # (no dropped slice to take: the route's, counted)
    hits, d0 = s.stats
    mid = out.binding().memory.id
    assert mid not in addresses, "a new handle's address is found by its first use"
    b = s.writing_to(out)
    s.client.execute(ADD, s.count, b, U)
    assert s.stats == (hits + 1, d0), s.stats
    assert mid in addresses
    await s.client.sync()
    q = await Setup(batch_seconds=1e-6).ready()
    q.client.create(bytes(16))  # the budget spent: the commands below wait for the actor
    later = q.client.empty(4 * N)
    b = q.writing_to(later)
    q0, qd0 = q.client._fast.queued_stats
    q.client.execute(ADD, q.count, b, U)
    await q.client.sync()
    assert q.client._fast.queued_stats == (q0 + 1, qd0), q.client._fast.queued_stats

    small = s.client.create(bytes(range(256)) * 4)
    await s.client.read([small])  # the route keeps a spare buffer of this size
    addresses.pop(small.binding().memory.id)  # as for a handle no route has used yet
    hits, d0 = s.stats
    (data,) = await s.client.read([small])  # a Handle: found through set_pointers too
    assert s.stats == (hits + 1, d0), s.stats  # (the no-op driver copies nothing)
    assert len(data) == 1024 and small.binding().memory.id in addresses

    def refuse(binding: Any) -> int:
        raise ac.InvalidHandle("refused by the test")

    fast.set_pointers(refuse)  # its error leaves the launch to the route, which runs it
    fresh = s.client.empty(4 * N)
    b = s.writing_to(fresh)
    hits, d0 = s.stats
    s.client.execute(ADD, s.count, b, U)
    assert s.stats == (hits, d0 + 1), s.stats
    await s.client.sync()
    assert fresh.binding().memory.id in addresses  # the route found it

    def interrupt(binding: Any) -> int:
        raise KeyboardInterrupt

    fast.set_pointers(interrupt)  # not an Exception: it propagates, it is not swallowed
    other = s.client.empty(4 * N)
    b = s.writing_to(other)
    hits, d0 = s.stats
    try:
        s.client.execute(ADD, s.count, b, U)
    except KeyboardInterrupt:
        pass
    else:
        raise AssertionError("a KeyboardInterrupt from the address lookup was swallowed")
    assert s.stats == (hits, d0), s.stats  # neither taken nor declined
    fast.set_pointers(s.server._ptr)
    s.client.execute(ADD, s.count, b, U)  # the client still serves
    await s.client.sync()
    assert s.stats == (hits + 1, d0), s.stats
    assert fast is s.client._fast
    await q.client.close()
    await s.client.close()


def bench_overhead_lib() -> ctypes.CDLL:
    """The no-op libcuda.so.1 that install_fake() loaded."""
    from asynccube._core.cuda import driver

    return driver._module._lib  # type: ignore[no-any-return,union-attr]


async def profiling() -> None:
    """With a recorder on, launches take the route (it records them)."""
    s = await Setup(KernelRecorder(ProfilingLevel.MEDIUM)).ready()
    hits, d0 = s.stats
    s.client.execute(ADD, s.count, s.bindings, U)
    assert s.stats == (hits, d0 + 1), s.stats
    await s.client.sync()
    await s.client.close()


async def write_one() -> None:
    """A dense write of a whole buffer's range (``create``'s) is queued in one step
    (``_write_one``) with the general path's bookkeeping: the stream's cursor and the
    buffer's stamp move; a small write of ``bytes`` is staged in one of the one-call
    write's spares, kept with the copy's stamp (reused once the stream passed it), a
    larger one in a pinned buffer the retirer holds until the device passes the copy.
    Any other write (strided, past the buffer's end, the wrong length) is left to the
    general path, which raises what it raises."""
    s = await Setup().ready()
    c, server = s.client, s.server
    big, h = c.empty(SMALL_WRITE + 4), c.empty(4 * N)
    await c.sync()
    taken: list[bool] = []
    one = server._write_one
    server._write_one = lambda *a: taken.append(one(*a)) or taken[-1]  # type: ignore[method-assign]
    sid, cursor = server._streams.last_use[h.memory.id]
    c.write([(h.copy_descriptor((4 * N,), (1,), 1), bytes(4 * N))])
    stream = server._streams.streams.get(ac.StreamId.current()).stream
    assert taken == [True] and server._streams.last_use[h.memory.id][1] == cursor + 1
    spares = server._small_writes[4 * N]
    assert [stamp for _, stamp in spares] == [(sid, cursor + 1)], "kept with its stamp"
    assert int(stream) not in server._retirer._parked
    c.write([(h.copy_descriptor((2 * N,), (1,), 2), bytes(4 * N))])  # 2-byte elements
    assert taken == [True, True] and server._streams.last_use[h.memory.id][1] == cursor + 2
    assert len(spares) == 2, "the first spare's copy is not passed yet: a second one"
    await c.sync()  # the stream passed both copies
    first = spares[0][0]
    c.write([(h.copy_descriptor((4 * N,), (1,), 1), bytes(4 * N))])
    assert len(spares) == 2 and spares[-1][0] is first, "a passed spare is reused"
    c.write([(big.copy_descriptor((SMALL_WRITE + 4,), (1,), 1), bytes(SMALL_WRITE + 4))])
    assert int(stream) in server._retirer._parked, "a larger write's staging is held"
    taken.clear()
    c.write([(h.copy_descriptor((4 * N,), (1,), 1), bytes(4 * N))])
    assert taken == [True]
    stamp = server._streams.last_use[h.memory.id]
    assert not one(h.copy_descriptor((N,), (2,), 2), bytes(2 * N), sid)  # strided
    assert not one(h.copy_descriptor((8 * N,), (1,), 1), bytes(8 * N), sid)  # past its end
    assert server._streams.last_use[h.memory.id] == stamp, "declined: nothing moved"
    c.write([(h.copy_descriptor((4 * N,), (1,), 1), bytes(10))])  # the wrong length
    assert taken == [True, False], taken
    raised = await Setup.failure(c.read([h]), ac.AsyncCubeError)
    assert raised is not None and "data has 10 bytes" in str(raised), raised
    await c.close()


async def closed() -> None:
    """A closed client raises its typed error, through the route."""
    s = await Setup().ready()
    await s.client.close()
    try:
        s.client.execute(ADD, s.count, s.bindings, U)
    except ac.ClientClosedError:
        pass
    else:
        raise AssertionError("a closed client launched")


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        taken,
        declined,
        scalar_dtype,
        scalar_groups,
        other_stream,
        new_task,
        launch_error,
        foreign_handle,
        zero_count,
        read_tensor_item,
        profiling,
        read_taken,
        read_declined,
        read_error,
        sync_taken,
        sync_wakes_once,
        sync_overlapped,
        wait_taken,
        spins_once,
        under_trio,
        queued,
        first_use,
        write_one,
    )
}
SCENARIOS["closed"] = closed


def main(scenarios: dict[str, Callable[[], Awaitable[None]]] = SCENARIOS) -> None:
    """Run the scenarios named on the command line (all without one)."""
    for name in sys.argv[1:] or list(scenarios):
        asyncio.run(scenarios[name]())
        print("ok", name, ACTIVE)


if __name__ == "__main__":
    main()
