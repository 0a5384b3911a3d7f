"""Scenarios of the one-call write route (``FastLaunch.write``, ``cuda/fast.py``: the
copy of ``create(bytes)``) on the real client -> channel -> CudaServer path against the
no-op driver of ``benchmarks/bench_overhead.py``.

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_write_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.
"""

from __future__ import annotations

import asyncio
import ctypes
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fast_launch_scenario import (
    ACTIVE,
    ADD,
    N,
    Setup,
    U,
    ac,
    bench_overhead,
    bench_overhead_lib,
    main,
)

SIZE = 4 * N  # the add kernel's buffers


def write_stats(s: Setup) -> tuple[int, int]:
    """(writes taken, writes left to the route) of ``s``'s FastLaunch."""
    fast: Any = s.client._fast
    hits, declined = fast.write_stats
    return int(hits), int(declined)


def spares(s: Setup, size: int = SIZE) -> list[tuple[Any, Any]]:
    """The server's spare staging buffers of ``size`` and their copies' stamps."""
    return s.server._small_writes.get(size, [])


def body(i: int, size: int = SIZE) -> bytes:
    return bytes([i % 251]) * size


def dropped(s: Setup, n: int) -> Awaitable[None]:
    """Leave ``n`` dropped slices of ``SIZE`` that the device has passed once the sync
    returned is awaited (a create's ``FastLaunch.empty`` takes one, then its copy is
    offered to ``FastLaunch.write``)."""
    handles = [s.client.empty(SIZE) for _ in range(n)]  # alive together: n slices
    done = s.client.sync()
    del handles
    return done


def connected() -> Awaitable[Any]:
    """A client opened by ``ac.connect("cuda:0")`` over the no-op driver: the server built
    as for a GPU (``open_cuda_server``: the options of the configuration, ``warm()``, the
    client's batch from ``[streaming]``), only the device's context and properties the
    fake's (the no-op driver has no device to query)."""
    from asynccube._core.cuda import driver
    from asynccube._core.cuda import server as cuda_server

    props = bench_overhead._server().properties
    context: Any = driver.DeviceContext

    async def opened() -> Any:
        found, opens = cuda_server.device_properties, context.__dict__["open"]
        cuda_server.device_properties = lambda index: props
        context.open = classmethod(lambda cls, index: cls(index, 1, 1))
        try:
            return await ac.connect("cuda:0")
        finally:
            cuda_server.device_properties = found
            context.open = opens

    return opened()


async def write_taken() -> None:
    """``create(bytes)``'s copy is taken in one call: the bytes staged in a page-locked
    buffer the server keeps, the stream's cursor and the buffer's stamp moved as the
    route moves them; once a read of the stream passed the copy, the same staging buffer
    serves the next create."""
    s = await Setup().ready()
    c = s.client
    await dropped(s, 1)
    hits, declined = write_stats(s)
    h = c.create(body(1))
    assert write_stats(s) == (hits + 1, declined), write_stats(s)
    (buf, stamp), *rest = spares(s)
    assert not rest and ctypes.string_at(buf.ptr, SIZE) == body(1)
    assert s.server._streams.last_use[h.memory.id] == stamp
    assert stamp[1] > s.server._created_at[h.memory.id][1], "the copy follows the mint"
    assert not s.server._retirer._parked, "the spare is kept by the server, not retired"
    live = [h]
    del h
    for i in range(2, 12):
        await c.read(live)  # marks the stream done up to the read: the copy passed
        live.clear()  # its slice free at once: the next create's FastLaunch.empty takes it
        live.append(c.create(body(i)))
        assert [b for b, _ in spares(s)] == [buf], "the one spare is reused"
        assert ctypes.string_at(buf.ptr, SIZE) == body(i)
    assert write_stats(s) == (hits + 11, declined), write_stats(s)
    await c.close()
    assert not s.server._small_writes, "the spares are released at the close"


async def write_in_flight() -> None:
    """A staging buffer whose copy the stream has not passed is never written again:
    creates in a row each stage into a buffer of their own (up to the server's limit,
    then the route, which stages through its pool); a sync passes them all."""
    from asynccube._core.cuda import transfers

    s = await Setup().ready()
    c = s.client
    await dropped(s, 8)
    hits, declined = write_stats(s)
    made = [c.create(body(i)) for i in range(5)]
    kept = spares(s)
    assert len({id(b) for b, _ in kept}) == 5, kept
    assert [ctypes.string_at(b.ptr, SIZE) for b, _ in kept] == [body(i) for i in range(5)]
    limit = transfers.WRITE_SPARES
    transfers.WRITE_SPARES = 5  # type: ignore[misc]
    try:
        made.append(c.create(body(9)))  # no spare free, the server keeps no more: the route
    finally:
        transfers.WRITE_SPARES = limit  # type: ignore[misc]
    assert write_stats(s) == (hits + 5, declined + 1), write_stats(s)
    assert [ctypes.string_at(b.ptr, SIZE) for b, _ in kept] == [body(i) for i in range(5)]
    assert int(s.server._streams.streams.get(ac.StreamId.current()).stream) in (
        s.server._retirer._parked
    ), "the route's staging buffer is held until the device passes it"
    await c.sync()
    made.append(c.create(body(7)))
    assert len(spares(s)) == 5 and write_stats(s) == (hits + 6, declined + 1)
    await c.close()


async def write_declined() -> None:
    """Whatever the route must see is left to it before anything changes: a tainted
    buffer, data of another length or type, a body above ``SMALL_WRITE``, a buffer last
    used on another task's stream; the route then writes (and raises what it raises)."""
    from asynccube._core.cuda.transfers import SMALL_WRITE

    s = await Setup().ready()
    c, fast = s.client, s.client._fast
    assert fast is not None
    h = c.create(body(1))
    hits, declined = write_stats(s)
    stamp = s.server._streams.last_use[h.memory.id]
    assert fast.write(h, bytes(10)) is False  # the wrong length
    assert fast.write(h, bytearray(SIZE)) is False  # not bytes
    assert fast.write(h.memory, body(2)) is False  # not a Handle or Binding
    big = c.empty(SMALL_WRITE + 4)
    assert fast.write(big, bytes(SMALL_WRITE + 4)) is False  # above SMALL_WRITE
    assert write_stats(s) == (hits, declined + 4)
    assert s.server._streams.last_use[h.memory.id] == stamp, "declined: nothing moved"

    async def other() -> None:
        assert fast.write(h, body(3)) is False  # last used on the first task's stream

    await asyncio.create_task(other())
    c.execute(ADD, ac.CubeCount(777), s.bindings, U)  # fails: its buffers tainted
    try:
        await c.sync()
    except ac.DeviceError:
        pass
    assert fast.write(s.handles[0], body(4)) is False, "a tainted buffer: the route"
    s.rewrite()  # the route's write clears the taints
    assert fast.write(s.handles[0], bytes(SIZE)) is True
    await c.close()
    try:
        c.create(body(5))
    except ac.ClientClosedError:
        pass
    else:
        raise AssertionError("a closed client created a buffer")


async def write_error() -> None:
    """A copy the driver refuses is held for the stream (raised by the next awaited
    call there) and taints the buffer, as the route's write does; the client serves on."""
    s = await Setup().ready()
    c = s.client
    h = c.create(body(1))
    await c.read([h])
    await dropped(s, 1)
    hits, _ = write_stats(s)
    flag = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_fail_htod")
    flag.value = 1  # CUDA_ERROR_INVALID_VALUE
    try:
        bad = c.create(body(2))
    finally:
        flag.value = 0
    assert write_stats(s)[0] == hits + 1, write_stats(s)
    raised: BaseException | None = None
    try:
        await c.sync()
    except ac.DeviceError as exc:
        raised = exc
    assert raised is not None and "cuMemcpyHtoDAsync" in str(raised), raised
    raised = None
    try:
        await c.read([bad])
    except ac.AsyncCubeError as exc:
        raised = exc
    assert raised is not None and "cuMemcpyHtoDAsync" in str(raised), raised
    good = c.create(body(3))
    assert len((await c.read([good]))[0]) == SIZE
    await c.close()


async def write_connected() -> None:
    """The sequence of the GPU test ``test_create_stages_each_body_until_the_device_copied_it``
    on a client ``ac.connect`` opens (:func:`connected`). The first launch of a kernel not
    loaded yet waits in the queue for its load (a worker thread), on the caller's stream:
    the creates behind it are left to the route (``FastLaunch.empty`` declines, so the
    write is not even offered: their copies must not pass that launch) and still read back
    their bodies. Once the kernel is loaded, its launch is taken in one call, and creates
    right behind it (their stream not passed) each stage into a buffer of their own; once
    read, the next creates reuse those buffers. (The no-op driver copies nothing: the
    staging buffers are checked, not what a read gives.)"""
    c = await connected()
    fast: Any = c._fast
    spares: dict[int, list[tuple[Any, Any]]] = c.server._small_writes  # type: ignore[attr-defined]
    first = ac.Kernel("fw_first", cuda=ac.CudaSource(bench_overhead.ADD, "empty_kernel"))
    one, nothing, n = ac.CubeCount(1), ac.Bindings(), 8
    hits, declined = fast.write_stats
    for loaded in (False, True):
        handles = [c.empty(SIZE) for _ in range(2 * n)]  # slices for fast.empty to take
        await c.sync()
        del handles
        taken, left = fast.stats  # launches and allocations: taken, left to the route
        c.execute(first, one, nothing)
        made = [c.create(body(i)) for i in range(n)]
        if loaded:  # the launch and the creates' allocations taken
            assert fast.stats == (taken + 1 + n, left), fast.stats
        else:  # the launch waits for its load: the allocations behind it are declined
            assert fast.stats == (taken, left + 1 + n), fast.stats
        hits += n if loaded else 0
        assert fast.write_stats == (hits, declined), (loaded, fast.write_stats)
        staged = [ctypes.string_at(buf.ptr, SIZE) for buf, _ in spares.get(SIZE, [])]
        assert staged == ([body(i) for i in range(n)] if loaded else []), loaded
        for h in made:
            assert len((await c.read([h]))[0]) == SIZE
    kept = [buf for buf, _ in spares[SIZE]]
    again = [c.create(body(100 + i)) for i in range(n)]
    assert fast.write_stats == (hits + n, declined), fast.write_stats
    assert {id(buf) for buf, _ in spares[SIZE]} == {id(buf) for buf in kept}, "reused"
    staged = {ctypes.string_at(buf.ptr, SIZE) for buf in kept}
    assert staged == {body(100 + i) for i in range(n)}
    assert [len(b) for b in await c.read(again)] == [SIZE] * n
    await c.close()


async def write_large_helped() -> None:
    """``create(bytes)`` of 1 MiB (past the one-call route): the body is staged into a
    page-locked buffer by ``hot.copy_into``, whose copy helpers take pieces of it where
    the machine has them (forced here), the buffer held until the device passed the copy
    and back in the pool after a sync; the pool gives the same buffer to the next one.
    A 512 KiB read's bytes are copied out of its staging buffer the same way
    (``hot.bytes_at``), the buffer back in the pool at once."""
    from asynccube._core.cuda import transfers
    from asynccube._core.cuda.native.hotpath import hot

    s = await Setup().ready()
    c = s.client
    size = 1 << 20
    helpers = transfers.COPY_HELPERS
    transfers.COPY_HELPERS = 3  # type: ignore[misc]
    try:
        pooled = hot.copy_stats()[0]
        for i in range(6):
            data = bytes([i + 1]) * (size - 1) + bytes([i + 7])
            h = c.create(data)
            key = int(s.server._streams.streams.get(ac.StreamId.current()).stream)
            _, held = s.server._retirer._parked[key]
            staged = [o for o in held if getattr(o, "size", None) == size]
            assert len(staged) == 1, held
            assert ctypes.string_at(staged[0].ptr, size) == data
            del staged, held
            assert [len(b) for b in await c.read([h])] == [size]
            await c.sync()  # the staging buffer back in the pool
        allocated = s.server._pinned.allocated
        c.create(bytes(size))
        assert s.server._pinned.allocated == allocated, "a pooled buffer, no new allocation"
        if ACTIVE == "native":
            assert hot.copy_stats()[0] == pooled + 7, "each staging copy went to the helpers"
        half = c.create(bytes(size // 2))  # 512 KiB: its read comes back as new bytes
        await c.sync()
        allocated = s.server._pinned.allocated
        for _ in range(4):  # the read's staging buffer back in the pool each time
            (got,) = await c.read([half])
            assert type(got) is bytes and len(got) == size // 2
            assert s.server._pinned.allocated == allocated
        if ACTIVE == "native":
            assert hot.copy_stats()[0] == pooled + 12, "the reads' copies too"
    finally:
        transfers.COPY_HELPERS = helpers  # type: ignore[misc]
    await c.close()


async def read_into_off_the_loop() -> None:
    """A ``read_into`` (so ``read_array``) whose target is not page-locked copies the
    staged bytes back in a worker thread from ``OFF_LOOP_COPY`` bytes, on the loop below
    it, the pinned buffer back in the pool once the copy is done; a copy that raises
    fails the read with its error, the buffer back as well, and the client serves on."""
    import threading

    from asynccube._core.cuda import transfers

    s = await Setup().ready()
    c = s.client
    pool = s.server._pinned
    on_loop = threading.get_ident()
    threads: list[int] = []
    failing: list[BaseException] = []
    real = transfers.hot.copy_into

    def recorded(*args: Any) -> Any:
        threads.append(threading.get_ident())
        if failing:
            raise failing[0]
        return real(*args)

    big = transfers.OFF_LOOP_COPY
    small = big // 2  # still through copy_into (>= COPY_SPLIT), on the loop
    assert small >= transfers.COPY_SPLIT
    transfers.hot.copy_into = recorded  # type: ignore[attr-defined]
    try:
        for size, off in ((big, True), (small, False)):
            h = c.create(bytes(size))
            out = bytearray(size)
            await c.read_into(h, out)  # its staging buffer made, then cached by the pool
            await c.sync()
            cached, threads[:] = pool.cached, []
            await c.read_into(h, out)
            assert threads and all((t != on_loop) is off for t in threads), (size, threads)
            assert pool.cached == cached, "the staging buffer back in the pool"
        h = c.create(bytes(big))
        await c.sync()
        cached = pool.cached
        failing.append(RuntimeError("the copy failed"))
        raised = await Setup.failure(c.read_into(h, bytearray(big)), RuntimeError)
        assert raised is not None and "the copy failed" in str(raised), raised
        assert pool.cached == cached, "the staging buffer back after a failed copy too"
        failing.clear()
        array = await c.read_array(h, np.uint8)
        assert array.nbytes == big and array.flags.writeable
    finally:
        transfers.hot.copy_into = real  # type: ignore[attr-defined]
    await c.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        write_taken,
        write_in_flight,
        write_declined,
        write_error,
        write_connected,
        write_large_helped,
        read_into_off_the_loop,
    )
}


if __name__ == "__main__":
    main(SCENARIOS)
