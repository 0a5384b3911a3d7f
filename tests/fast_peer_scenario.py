"""Scenarios of ``to_client`` between two CUDA clients of one device (the peer path of
``client/transfer.py``: ``cuMemcpyPeerAsync`` after an event) on the real client ->
channel -> CudaServer path against the no-op driver of ``benchmarks/bench_overhead.py``.

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_peer_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.

The order of what each client issues is traced at the driver: each peer copy notes how
many launches the (shared) fake library had seen when it was issued.
"""

from __future__ import annotations

import asyncio
import ctypes
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from fast_launch_scenario import (
    ACTIVE,
    ADD,
    EMPTY,
    ComputeClient,
    ac,
    bench_overhead,
    bench_overhead_lib,
    main,
)

SIZE = 4096
TRACED = ("cuEventRecord", "cuStreamWaitEvent", "cuLaunchKernel", "cuStreamQuery")
ONE, NOTHING = ac.CubeCount(1), ac.Bindings()


class Pair:
    """Two clients on two fake servers of one device (``devices=2``: the destination's
    on a second device, its own context, the two reaching each other), a source buffer,
    the driver traced."""

    def __init__(self, batch_seconds: float = 1e-3, devices: int = 1) -> None:
        from asynccube._core.cuda import driver

        loop = asyncio.get_running_loop()
        fake: Any = driver._module
        if devices == 2:
            fake.cuDeviceCanAccessPeer = lambda a, b: (0, 1)
        self.src = ComputeClient(bench_overhead._server(), loop, batch_seconds=batch_seconds)
        self.dst = ComputeClient(_server(devices - 1), loop, batch_seconds=batch_seconds)
        self._copies: list[int] = []
        """The twin's peer copies (through the Python fake): the launches made before each."""
        self._fail = 0
        self._fake = fake
        lib = bench_overhead_lib()
        self._c_peers = ctypes.c_long.in_dll(lib, "fake_peers")
        self._c_peers.value = 0
        self._c_trace = (ctypes.c_long * 4096).in_dll(lib, "fake_peer_at")
        self._c_fail = ctypes.c_int.in_dll(lib, "fake_fail_peer")

        def memcpy_peer(*args: Any) -> tuple[int]:
            self._copies.append(self.launches())
            return (self._fail,)

        fake.cuMemcpyPeerAsync = memcpy_peer
        self.python_calls: dict[str, int] = {}
        """The twin's calls through the Python fake (the compiled module's go to C)."""
        for name in TRACED:
            setattr(fake, name, self._counted(name, getattr(fake, name)))

    def _counted(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any) -> Any:
            self.python_calls[name] = self.python_calls.get(name, 0) + 1
            return call(*args)

        return counted

    @property
    def copies(self) -> list[int]:
        """The launches made before each peer copy (the compiled module's go to the C fake,
        which traces them too)."""
        return [*self._copies, *self._c_trace[: self._c_peers.value]]

    @property
    def fail_copy(self) -> int:
        return self._fail

    @fail_copy.setter
    def fail_copy(self, err: int) -> None:
        """Fail every peer copy with the CUresult ``err`` (0: they succeed)."""
        self._fail = self._c_fail.value = err

    async def ready(self) -> Pair:
        self.h = self.src.create(bytes(range(256)) * (SIZE // 256))
        for client in (self.src, self.dst):
            client.execute(EMPTY, ONE, NOTHING)  # loaded, checked
            await client.sync()
        return self

    def launches(self) -> int:
        c_calls = bench_overhead.c_calls(bench_overhead_lib()).get("cuLaunchKernel", 0)
        return c_calls + self.python_calls.get("cuLaunchKernel", 0)

    def calls(self) -> dict[str, int]:
        """The fake library's calls so far, with the Python driver's peer copies."""
        out = bench_overhead.c_calls(bench_overhead_lib())
        for name, n in self.python_calls.items():
            out[name] = out.get(name, 0) + n
        return {**out, "cuMemcpyPeerAsync": len(self.copies)}  # the C fake's counted here

    @staticmethod
    async def raised(what: Awaitable[Any]) -> BaseException:
        """The error ``what`` raised (AssertionError if it raised none)."""
        try:
            await what
        except ac.AsyncCubeError as exc:
            return exc
        raise AssertionError("no error was raised")

    def untrace(self) -> None:
        for name in ("cuMemcpyPeerAsync", *TRACED):
            delattr(self._fake, name)

    async def close(self) -> None:
        self.untrace()
        await self.src.close()
        await self.dst.close()


def _server(ordinal: int) -> Any:
    """A fake server of device ``ordinal``: device 0's is ``bench_overhead``'s (context 1,
    the one the fake's ``cuCtxGetCurrent`` answers); another's has context ``ordinal + 1``."""
    if not ordinal:
        return bench_overhead._server()
    from asynccube._core.cuda.driver import DeviceContext
    from asynccube._core.cuda.server import CudaServer

    props = bench_overhead._server().properties
    return CudaServer(DeviceContext(ordinal, ordinal + 1, ordinal + 1), properties=props)


def fresh() -> ac.Kernel:
    """A kernel not loaded yet: its first launch waits in the queue for a worker thread's
    load (the actor awaits it: what is queued behind it waits)."""
    name = f"fp_{uuid.uuid4().hex}"
    return ac.Kernel(name, cuda=ac.CudaSource(f"// {name}\n" + bench_overhead.ADD, "empty_kernel"))


def diff(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


async def peer_inline() -> None:
    """Both actors idle: one ``to_client`` issues the whole copy before it returns, with
    the driver calls of the copy alone (the copy, an event after it, the source's stream
    waits for that; the source's stream has nothing left to run here, so no event of
    its work and no wait for it on the destination: once ``cuStreamQuery`` after a
    launch on the source, not at all when nothing ran there since the last copy), makes
    no future, queues nothing, creates no event once warm."""
    p = await Pair().ready()
    p.src.to_client(p.h, p.dst)  # warm: the events pooled
    await p.dst.sync()
    await p.src.sync()
    before, made = p.calls(), [c.server._events.created for c in (p.src, p.dst)]  # type: ignore[attr-defined]
    pending = [len(c._channel._pending) for c in (p.src, p.dst)]
    copy = p.src.to_client(p.h, p.dst)
    got = diff(p.calls(), before)
    want = {"cuEventRecord": 1, "cuStreamWaitEvent": 1, "cuMemcpyPeerAsync": 1}
    assert got == want, got
    p.src.execute(EMPTY, ONE, NOTHING)  # the source's stream moved on: asked again
    before = p.calls()
    p.src.to_client(p.h, p.dst)
    got = diff(p.calls(), before)
    want = {"cuStreamQuery": 1, "cuEventRecord": 1, "cuStreamWaitEvent": 1, "cuMemcpyPeerAsync": 1}
    assert got == want, got
    assert [len(c._channel._pending) for c in (p.src, p.dst)] == pending, "futures made"
    assert not p.src._channel._queue and not p.dst._channel._queue, "commands queued"
    assert [c.server._events.created for c in (p.src, p.dst)] == made  # type: ignore[attr-defined]
    assert bool(p._copies) == (ACTIVE == "python"), "the compiled module made the copy's call"
    assert len((await p.dst.read([copy]))[0]) == SIZE
    await p.close()


async def peer_queued() -> None:
    """Copies sent past the iteration's budget (both actors have work queued) cost each
    the same driver calls, and no actor waits for the other's: whichever command runs
    first takes the other's from the head of its queue and does the whole copy, so the
    actors drain them in slices of the budget (1 ms), not a loop round trip per copy."""
    p = await Pair().ready()
    n = 1000
    p.src.to_client(p.h, p.dst)
    await p.dst.sync()
    before = p.calls()
    copies = [p.src.to_client(p.h, p.dst) for _ in range(n)]
    assert p.src._channel._queue or p.dst._channel._queue, "nothing was queued"
    iterations = 0
    done = False

    def tick() -> None:
        nonlocal iterations
        iterations += 1
        if not done:
            asyncio.get_running_loop().call_soon(tick)

    tick()
    await p.dst.sync()
    done = True
    got = diff(p.calls(), before)
    assert got.get("cuMemcpyPeerAsync") == n, got
    assert got.get("cuStreamWaitEvent", 0) == n, got  # the source's, for each copy
    assert iterations < n // 10, f"{iterations} loop iterations for {n} queued copies"
    for h in copies[:: n // 4]:
        assert len((await p.dst.read([h]))[0]) == SIZE
    await p.close()


async def peer_busy_source() -> None:
    """The source's actor awaits a kernel's load when ``to_client`` is called: the copy
    is issued after that launch (it sees the source's earlier work), the destination's
    later work after the copy, and nothing blocks the loop meanwhile."""
    p = await Pair().ready()
    base = p.launches()
    p.src.execute(fresh(), ONE, NOTHING)  # the source's earlier work, behind its load
    copy = p.src.to_client(p.h, p.dst)
    p.dst.execute(EMPTY, ONE, NOTHING)  # the destination's later work
    assert not p.copies and p.launches() == base, "issued before the source's work"
    assert len((await p.dst.read([copy]))[0]) == SIZE
    await p.src.sync()
    assert p.copies == [base + 1], (p.copies, base)
    assert p.launches() == base + 2
    await p.close()


async def peer_busy_dest() -> None:
    """The destination's actor awaits a kernel's load when ``to_client`` is called: the
    source exports at once and waits (its later work stays behind the copy); the copy is
    issued after the destination's earlier launch, and the source's later launch after
    the copy."""
    p = await Pair().ready()
    base = p.launches()
    p.dst.execute(fresh(), ONE, NOTHING)  # the destination's earlier work
    copy = p.src.to_client(p.h, p.dst)
    p.src.execute(EMPTY, ONE, NOTHING)  # the source's later work: after the copy
    assert not p.copies and p.launches() == base
    assert len((await p.dst.read([copy]))[0]) == SIZE
    await p.src.sync()
    assert p.copies == [base + 1], (p.copies, base)
    assert p.launches() == base + 2
    await p.close()


async def peer_errors() -> None:
    """A copy the driver refuses, and a failed export: held for the calling task's stream
    (on the destination; the export's on the source too), the new handle carries the
    failure, the source's events go back, and both clients keep serving, inline or
    queued."""
    for batch in (1e-3, 1e-6):
        p = await Pair(batch_seconds=batch).ready()
        events = len(p.src.server._events._free)  # type: ignore[attr-defined]
        p.fail_copy = 1  # CUDA_ERROR_INVALID_VALUE
        bad = [p.src.to_client(p.h, p.dst) for _ in range(3)]
        for _ in range(1000):  # queued ones are issued by the actors
            if len(p.copies) >= 3:
                break
            await asyncio.sleep(0)
        p.fail_copy = 0
        for h in bad:
            exc = await p.raised(p.dst.read([h]))
            assert "cuMemcpyPeerAsync" in str(exc), exc
        await p.src.sync()
        assert len(p.src.server._events._free) == max(events, 1), "an event was lost"  # type: ignore[attr-defined]

        from asynccube._core.cuda import peer

        def refuse(*args: Any) -> Any:
            raise ac.DeviceError("export refused (the scenario's)")

        export, peer.export = peer.export, refuse  # type: ignore[assignment]
        try:
            failed = p.src.to_client(p.h, p.dst)
        finally:
            peer.export = export  # type: ignore[assignment]
        for side, what in (("source", p.src.sync()), ("destination", p.dst.read([failed]))):
            exc = await p.raised(what)
            assert isinstance(exc, ac.DeviceError) and "export refused" in str(exc), (side, exc)
        good = p.src.to_client(p.h, p.dst)
        assert len((await p.dst.read([good]))[0]) == SIZE
        await p.close()


async def peer_dead_dest() -> None:
    """The destination's actor dies with copies queued and the source waiting on one:
    the source's commands end (its events back), it keeps serving, nothing hangs."""
    p = await Pair().ready()
    p.dst.execute(fresh(), ONE, NOTHING)  # the destination busy: the source waits
    copies = [p.src.to_client(p.h, p.dst) for _ in range(3)]
    p.dst._channel.kill_for_test(RuntimeError("boom"))
    await asyncio.wait_for(p.src.sync(), 10)
    try:
        await p.dst.read([copies[0]])
    except ac.ClientDeadError:
        pass
    else:
        raise AssertionError("a dead client read")
    h = p.src.create(bytes(8))
    assert await p.src.read([h]) == [bytes(8)]
    p.untrace()
    await p.src.close()
    await p.dst.close()


async def peer_cancelled_dest() -> None:
    """The destination closes with ``cancel_pending=True`` while a copy's command waits
    in its queue (its actor busy on a load), the source's already exported and waiting
    for it: the source is told (its event goes back), its sync returns, it keeps
    serving; nothing hangs."""
    p = await Pair().ready()
    p.dst.execute(fresh(), ONE, NOTHING)  # the destination's actor awaits a load
    copies = [p.src.to_client(p.h, p.dst) for _ in range(3)]
    await p.dst.close(cancel_pending=True)
    await asyncio.wait_for(p.src.sync(), 10)
    h = p.src.create(bytes(8))
    assert await p.src.read([h]) == [bytes(8)]
    del copies
    p.untrace()
    await p.src.close()


async def peer_cancelled_source() -> None:
    """The source closes with ``cancel_pending=True`` while its copy commands wait in its
    queue (its actor busy on a load), the destination's first command waiting for the
    source's: every copy's handle carries ClientClosedError (the destination's sync
    raises it, as a held failure), and it keeps serving; nothing hangs."""
    p = await Pair().ready()
    p.src.execute(fresh(), ONE, NOTHING)  # the source's actor awaits a load
    copies = [p.src.to_client(p.h, p.dst) for _ in range(3)]
    for _ in range(3):
        await asyncio.sleep(0)  # the destination's actor reaches its first command
    await p.src.close(cancel_pending=True)
    held = await p.raised(asyncio.wait_for(p.dst.sync(), 10))  # the failed copies' error
    assert isinstance(held, ac.ClientClosedError), held
    for copy in copies:
        try:
            await asyncio.wait_for(p.dst.read([copy]), 10)
        except ac.ClientClosedError:
            pass
        else:
            raise AssertionError("a copy never made read without an error")
    h = p.dst.create(bytes(8))
    assert await p.dst.read([h]) == [bytes(8)]
    p.untrace()
    await p.dst.close()


async def peer_two_devices() -> None:
    """Two devices' clients, both idle: one ``to_client`` switches the calling thread's
    context twice, through the hot path (``hot.ctx_set``, never cuda.bindings' wrapper):
    to the destination's for its allocation, the wait and the copy, back to the
    source's for the finish, which stays current for the source's next command (its
    one-call routes need it); the destination's one-call allocation is not asked while
    its context is not current (it would decline). Queued copies between the two
    devices (each actor's commands run with its context current) arrive too."""
    from asynccube._core.cuda import driver, peer

    p = await Pair(devices=2).ready()
    p.src.to_client(p.h, p.dst)  # warm: peer access enabled (a worker thread), events pooled
    await p.dst.sync()
    await p.src.sync()
    await p.src.sync()  # the source's context current again
    switches: list[Any] = []
    ctx_set, wrapped = peer.hot.ctx_set, p._fake.cuCtxSetCurrent
    inside = [False]

    def hot_switch(context: Any) -> Any:
        switches.append(context)
        inside[0] = True  # the twin's own call goes through the Python fake
        try:
            return ctx_set(context)
        finally:
            inside[0] = False

    def wrapper_switch(context: Any) -> Any:
        if not inside[0]:
            switches.append(("cuda.bindings", context))
        return wrapped(context)

    peer.hot.ctx_set = hot_switch  # type: ignore[attr-defined]
    p._fake.cuCtxSetCurrent = wrapper_switch
    asked = [0]
    fast, empty = p.dst._fast, p.dst._fast.empty  # type: ignore[attr-defined]

    class Counted:  # FastLaunch's slots forbid patching it: stands for it
        def empty(self, size: int) -> Any:
            asked[0] += 1
            return empty(size)

    p.dst._fast = Counted()  # type: ignore[assignment]
    try:
        before = p.calls()
        assert driver._tls.context is p.src.server.context.context  # type: ignore[attr-defined]
        copy = p.src.to_client(p.h, p.dst)
        got = diff(p.calls(), before)
        assert not p.src._channel._queue and not p.dst._channel._queue, "commands queued"
    finally:
        peer.hot.ctx_set = ctx_set  # type: ignore[attr-defined]
        del p._fake.cuCtxSetCurrent
        p.dst._fast = fast
    src_ctx, dst_ctx = p.src.server.context.context, p.dst.server.context.context  # type: ignore[attr-defined]
    assert switches == [dst_ctx, src_ctx], switches
    assert driver._tls.context is src_ctx
    assert asked[0] == 0, "the destination's one-call allocation asked with another context"
    assert got.get("cuMemcpyPeerAsync") == 1 and got.get("cuStreamWaitEvent") == 1, got
    assert len((await p.dst.read([copy]))[0]) == SIZE
    p.dst.execute(fresh(), ONE, NOTHING)  # the destination busy: the copies are queued
    copies = [p.src.to_client(p.h, p.dst) for _ in range(20)]
    assert p.src._channel._queue or p.dst._channel._queue, "nothing was queued"
    for h in (copies[0], copies[-1]):
        assert len((await p.dst.read([h]))[0]) == SIZE
    await p.src.sync()
    await p.close()


class Order:
    """The order the streams of both clients see, from the driver's calls: a clock per
    stream (for each stream, the latest launch ordered before its tail; and the copies),
    moved by each event record and stream wait as the device would (a wait takes what
    the event's latest record saw) and by each launch (the fake's trace of their
    streams). A stream ``cuStreamQuery`` found idle has all of its clock done. Every
    launch on one of the source's streams stands for a write of the copied buffer: each
    copy must come after those before it, and each of them after the copies before it
    (the source's later writers wait for the copies' reads). What breaks that is noted
    in ``errors`` (raised inside a copy, it would only fail that copy)."""

    _HOT = ("event_record", "stream_wait_event", "memcpy_peer", "stream_query")

    def __init__(self, p: Pair) -> None:
        from asynccube._core.cuda import peer

        self.p, self.hot = p, peer.hot
        self.clock: dict[int, dict[object, int]] = {}
        self.recorded: dict[int, dict[object, int]] = {}
        self.done: dict[object, int] = {}
        """What idle streams had seen: done everywhere."""
        self.copies = self.launches = 0
        self.needs: list[tuple[int, int]] = []
        """The writes (stream, launch) each later copy must come after."""
        self.errors: list[str] = []
        lib = bench_overhead_lib()
        self._c_streams = (ctypes.c_void_p * 4096).in_dll(lib, "fake_launch_on")
        self._c_seen = self._c_count()
        self._py_streams: list[int] = []
        self._py_seen = 0
        self._py_launch = p._fake.cuLaunchKernel

        def py_launch(*args: Any) -> Any:
            self._py_streams.append(int(args[8]))
            return self._py_launch(*args)

        p._fake.cuLaunchKernel = py_launch
        self._saved = {name: getattr(self.hot, name) for name in self._HOT}
        for name in self._HOT:
            setattr(self.hot, name, getattr(self, "_" + name))

    def _c_count(self) -> int:
        return bench_overhead.c_calls(bench_overhead_lib()).get("cuLaunchKernel", 0)

    def catch_up(self) -> None:
        """Take in the launches issued since the last driver call seen."""
        count = self._c_count()
        streams = [self._c_streams[i % 4096] or 0 for i in range(self._c_seen, count)]
        self._c_seen = count
        streams += self._py_streams[self._py_seen :]
        self._py_seen = len(self._py_streams)
        source = {int(w.stream) for _, w in self.p.src.server._streams.streams.existing()}  # type: ignore[attr-defined]
        for stream in streams:
            self.launches += 1
            clock = self._of(stream)
            if stream in source:  # a write of the buffer
                if max(clock.get("copies", 0), self.done.get("copies", 0)) < self.copies:
                    self.errors.append(f"write {self.launches} not after the copies before it")
                self.needs.append((stream, self.launches))
            clock[stream] = self.launches

    def _of(self, stream: Any) -> dict[object, int]:
        return self.clock.setdefault(int(stream), {})

    def _event_record(self, event: Any, stream: Any) -> Any:
        self.catch_up()
        self.recorded[int(event)] = dict(self._of(stream))
        return self._saved["event_record"](event, stream)

    def _stream_wait_event(self, stream: Any, event: Any) -> Any:
        self.catch_up()
        seen = self.recorded.get(int(event))
        if seen is None:
            self.errors.append("a stream waits on an event never recorded")
        _merge(self._of(stream), seen or {})
        return self._saved["stream_wait_event"](stream, event)

    def _stream_query(self, stream: Any) -> Any:
        self.catch_up()
        err = self._saved["stream_query"](stream)
        if not err:
            _merge(self.done, self._of(stream))
        return err

    def _memcpy_peer(self, *args: Any) -> Any:
        self.catch_up()
        clock = self._of(args[5])
        for stream, n in self.needs:
            if max(clock.get(stream, 0), self.done.get(stream, 0)) < n:
                self.errors.append(f"copy {self.copies + 1} not after write {n} on {stream:#x}")
        self.copies += 1
        clock["copies"] = self.copies
        return self._saved["memcpy_peer"](*args)

    def close(self) -> None:
        self.catch_up()
        for name, call in self._saved.items():
            setattr(self.hot, name, call)
        self.p._fake.cuLaunchKernel = self._py_launch


def _merge(into: dict[object, int], seen: dict[object, int]) -> None:
    for key, n in seen.items():
        into[key] = max(into.get(key, 0), n)


def writes(p: Pair, h: ac.Handle) -> ac.Bindings:
    """The add kernel over ``h`` (it reads and writes it)."""
    return ac.Bindings().with_buffers([h.binding()] * 3).with_scalar(np.uint32, [SIZE // 4])


async def peer_back_to_back() -> None:
    """Issue 38: copies sent back to back from one stream while the source's device is
    busy record the source's event once and the destination's stream waits on it once
    (it was an event and two cross-device waits per copy, which made each copy wait for
    the one before across the two devices): n copies cost n + 1 waits, not 2n. The order
    holds (:class:`Order`), inline and queued: each copy comes after the source's
    earlier writes of its buffer (on this stream, on another task's), on this
    destination and on a second one, and the source's later writes after every copy.
    The source's kept event is destroyed when it closes."""
    p = await Pair().ready()
    third = ComputeClient(_server(0), asyncio.get_running_loop(), batch_seconds=1e-3)
    add = writes(p, p.h)
    p.src.execute(ADD, ONE, add)  # loaded, checked
    await p.src.sync()
    p.src.to_client(p.h, p.dst)  # warm: the events pooled
    p.src.to_client(p.h, third)
    await p.dst.sync()
    await third.sync()
    await p.src.sync()
    flag = ctypes.c_int.in_dll(bench_overhead_lib(), "fake_pending")
    flag.value = 1  # the device is slower than the host: the source's stream is busy
    order = Order(p)
    n = 8
    try:
        before = p.calls()
        p.src.execute(ADD, ONE, add)
        copies = [p.src.to_client(p.h, p.dst) for _ in range(n)]
        got = diff(p.calls(), before)
        assert got.get("cuMemcpyPeerAsync") == n and got.get("cuStreamQuery") == 1, got
        assert got.get("cuStreamWaitEvent") == n + 1, got  # 2n before
        assert got.get("cuEventRecord") == n + 1, got  # 2n before
        before = p.calls()
        copies.append(p.src.to_client(p.h, third))  # a stream that never waited on it
        got = diff(p.calls(), before)
        assert got.get("cuStreamWaitEvent") == 2 and got.get("cuEventRecord") == 1, got

        async def other() -> None:  # another task's stream writes the buffer
            p.src.execute(ADD, ONE, add)

        await asyncio.create_task(other())
        flag.value = 1
        copies += [p.src.to_client(p.h, p.dst) for _ in range(2)]
        p.src.execute(ADD, ONE, add)  # the source's later writer: after every copy
        p.dst.execute(fresh(), ONE, NOTHING)  # the destination busy: the copies queued
        queued = [p.src.to_client(p.h, p.dst) for _ in range(3)]
        p.src.execute(ADD, ONE, add)  # queued behind them on the source
        queued += [p.src.to_client(p.h, p.dst) for _ in range(3)]
        assert p.src._channel._queue and p.dst._channel._queue, "nothing was queued"
        await p.dst.sync()
        await p.src.sync()
        flag.value = 1
        p.src.execute(ADD, ONE, add)
        copies.append(p.src.to_client(p.h, p.dst))  # a new mark, with an event
        order.catch_up()
        assert order.copies == n + 10, order.copies
        assert order.launches >= 6 and not order.errors, order.errors
    finally:
        order.close()
        flag.value = 0
    for h in (copies[0], copies[-1], queued[0], queued[-1]):
        assert len((await p.dst.read([h]))[0]) == SIZE
    assert len((await third.read([copies[n]]))[0]) == SIZE
    await third.close()
    from asynccube._core.cuda import peer

    held = [m.event for m in peer._marks[p.src.server].values() if m.event is not None]
    assert held, "the source's stream keeps its mark's event"
    free = [int(e) for e in p.src.server._events._free]  # type: ignore[attr-defined]
    assert len(set(free)) == len(free), "an event went back twice"
    assert not set(free) & {int(e) for e in held}, "a mark's event is in the pool"
    destroyed: list[Any] = []

    def destroy(event: Any) -> tuple[int]:
        destroyed.append(event)
        return (0,)

    p._fake.cuEventDestroy = destroy
    try:
        await p.close()
    finally:
        del p._fake.cuEventDestroy
    assert all(e in destroyed for e in held), "a mark's event was not destroyed at close"


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (peer_inline, peer_queued, peer_busy_source, peer_busy_dest, peer_errors,
              peer_dead_dest, peer_cancelled_dest, peer_cancelled_source, peer_two_devices,
              peer_back_to_back)
}  # fmt: skip


if __name__ == "__main__":
    main(SCENARIOS)
