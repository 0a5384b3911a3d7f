"""Scenarios of DLPack import and export on a CUDA client (``client/interop.py``,
``cuda/interop.py``) on the real client -> channel -> CudaServer path against the no-op
driver of ``benchmarks/bench_overhead.py``: which stream a producer is asked for, which
stream waits for which event, what is kept alive, and the calls one exchange costs.

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_dlpack_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin.
"""

from __future__ import annotations

import asyncio
import cProfile
import ctypes
import gc
import pstats
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from asynccube._core.client import dlpack
from asynccube._core.client.client import ComputeClient
from asynccube._core.cuda import interop as cuda_interop
from fast_launch_scenario import ACTIVE, ADD, Setup, U, ac, bench_overhead_lib, main
from tasks import actor_idle

ADDRESS = 0x7000_0000
"""The fake producer's device address (the no-op driver never touches it)."""


class Producer:
    """A CUDA producer on device 0: records the stream each ``__dlpack__`` is given."""

    def __init__(self, n: int = 1024) -> None:
        self.n = n
        self.streams: list[Any] = []

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **_: Any) -> Any:
        self.streams.append(stream)
        versioned = max_version is not None and max_version[0] >= 1
        f4 = np.dtype(np.float32)
        return dlpack.make_capsule(ADDRESS, (2, 0), (self.n,), (1,), f4, self, versioned=versioned)


class Waits:
    """Stands for ``cuda/interop.py``'s ``hot``: records each ``stream_wait_event``."""

    def __init__(self, hot: Any) -> None:
        self.hot = hot
        self.waits: list[tuple[int, Any]] = []

    def stream_wait_event(self, stream: Any, event: Any) -> Any:
        self.waits.append((int(stream), event))
        return self.hot.stream_wait_event(stream, event)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.hot, name)


class Records:
    """Stands for the server's event pool: records the stream of each ``record``."""

    def __init__(self, events: Any) -> None:
        self.events = events
        self.streams: list[Any] = []

    def record(self, stream: Any) -> Any:
        self.streams.append(stream)
        return self.events.record(stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)


def _client() -> tuple[Any, ComputeClient]:
    from fast_launch_scenario import bench_overhead

    server = bench_overhead._server()
    return server, ComputeClient(server, asyncio.get_running_loop())


async def dlpack_import_waits_on_the_legacy_stream() -> None:
    """The producer is asked for the legacy default stream (``stream=1``: torch and
    CuPy on their default stream order nothing then), and the calling task's stream
    waits on the device for an event recorded there, at the call."""
    server, client = _client()
    waits = Waits(cuda_interop.hot)
    cuda_interop.hot = waits  # type: ignore[attr-defined]
    records = Records(server._events)
    server._events = records
    try:
        producer = Producer()
        t = client.from_dlpack(producer)
        ours = server.stream_handle(ac.StreamId.current())
        assert producer.streams == [1], producer.streams
        assert records.streams == [1], records.streams
        assert [stream for stream, _ in waits.waits] == [ours], (waits.waits, ours)
        assert t.shape == (producer.n,) and t.dtype == np.float32
        await client.sync()
    finally:
        cuda_interop.hot = waits.hot  # type: ignore[attr-defined]
        server._events = records.events
    await client.close()


async def dlpack_import_keeps_the_producer_until_dropped() -> None:
    """The consumed capsule and the producer live while the tensor refers to them (and
    until the device passed its last use), and are released after."""
    _, client = _client()
    before = dlpack.live_exports()
    producer = Producer()
    t = client.from_dlpack(producer)
    assert dlpack.live_exports() == before + 1
    del producer
    gc.collect()
    assert dlpack.live_exports() == before + 1
    del t
    await client.sync()
    gc.collect()
    assert dlpack.live_exports() == before, (dlpack.live_exports(), before)
    await client.close()


def _calls(fn: Callable[[], Any], n: int = 50) -> float:
    keep = [fn() for _ in range(5)]
    profile = cProfile.Profile()
    profile.enable()
    keep += [fn() for _ in range(n)]
    profile.disable()
    return float(pstats.Stats(profile).total_calls) / n  # type: ignore[attr-defined]


async def dlpack_calls_per_exchange() -> None:
    """Python calls per import and export on the compiled path, counted by cProfile
    (the producer's own capsule included in the import): 103 and 65 before these were
    cut (issue 38), 75 and 56 after, 75 and 36 with the export's ordering in one call
    (``FastLaunch.export``; the twin, which keeps the Python route: 94 and 66)."""
    _, client = _client()
    t = client.create_array(np.arange(1024, dtype=np.float32))
    await client.sync()
    producer = Producer()
    imports = _calls(lambda: client.from_dlpack(producer))
    await client.sync()
    exports = _calls(lambda: t.__dlpack__(stream=1, max_version=(1, 0)))
    await client.sync()
    if ACTIVE == "native":  # the twin's calls go through ctypes and Python wrappers
        assert imports <= 88, imports
        assert exports <= 40, exports
    await client.close()


async def dlpack_export_in_one_call() -> None:
    """``FastLaunch.export`` (compiled and twin): a buffer last used on the task's stream
    is exported in one call: its address, its stamp moved to the stream's next cursor (as
    ``resolve``), the server's export event recorded and the consumer's stream made to
    wait for it. Declined (None, nothing changed) for a buffer last used by another
    task's stream, with an error held, or behind a command queued on its stream; bad
    handles raise InvalidArgument, a refused wait the driver's error. The client takes
    it for ``__dlpack__(stream=...)`` on the compiled path (``one_call_export``), and the
    capsule's lease is released with the capsule."""
    s = await Setup().ready()
    client, server = s.client, s.server
    fast: Any = client._fast
    lib = bench_overhead_lib()
    waited = (ctypes.c_uint64 * 2).in_dll(lib, "fake_waited")
    streams = server._streams
    sid = ac.StreamId.current()
    wrapper = streams.streams.slots[sid.value % streams.max_streams]
    out = s.handles[2].binding()
    event = server.export_event()
    assert event == server.export_event() != 0, "one event per server"
    hits, declined = fast.export_stats
    cursor = wrapper.cursor
    address = fast.export(out, 0x5000, event)
    assert address == server._ptr(out), (address, server._ptr(out))
    assert fast.export_stats == (hits + 1, declined), fast.export_stats
    assert streams.last_use[out.memory.id] == (sid, cursor + 1) == (sid, wrapper.cursor)
    assert tuple(waited) == (0x5000, event), tuple(waited)

    def refused(why: str) -> None:
        before = (fast.export_stats[0], wrapper.cursor, streams.last_use.get(out.memory.id))
        assert fast.export(out, 0x5000, event) is None, why
        after = (fast.export_stats[0], wrapper.cursor, streams.last_use.get(out.memory.id))
        assert after == before, (why, before, after)

    refused_types = fast.export_stats[1]
    assert fast.export("not a binding", 0x5000, event) is None
    assert fast.export_stats[1] == refused_types + 1
    for consumer, ev in ((0, event), (0x5000, 0), ("a stream", event), (0x5000, None)):
        try:
            fast.export(out, consumer, ev)
        except ac.InvalidArgument:
            pass
        else:
            raise AssertionError(f"export({consumer!r}, {ev!r}) did not raise")

    async def other() -> None:  # another task's stream uses the buffer last
        client.execute(ADD, s.count, s.bindings, U)

    await asyncio.create_task(other())
    refused("last used on another stream")
    await client.sync()
    client.execute(ADD, s.count, s.bindings, U)  # this stream's again: taken
    assert fast.export(out, 0x5000, event) == address
    client._channel._inline_spent = 1.0  # the budget spent: a new grid's launch queues
    client.execute(ADD, ac.CubeCount(s.count.x * 2), s.bindings)
    assert client._channel._queue, "queued"
    refused("a command of its stream queued")
    await client.sync()
    await actor_idle(client)
    client.execute(ADD, ac.CubeCount(777), s.bindings, U)  # fails: held, buffers tainted
    refused("an error held")
    assert await Setup.failure(client.sync(), ac.DeviceError) is not None
    s.rewrite()
    await client.sync()
    await actor_idle(client)
    fail = ctypes.c_int.in_dll(lib, "fake_fail_wait")
    fail.value = 1  # CUDA_ERROR_INVALID_VALUE
    raised: BaseException | None = None
    try:
        fast.export(out, 0x5000, event)
    except ac.AsyncCubeError as exc:
        raised = exc
    finally:
        fail.value = 0
    assert raised is not None and "cuStreamWaitEvent" in str(raised), raised
    t = client.tensor(s.handles[2], (s.count.x * 256,), np.float32)
    live, hits = server._exports.live, fast.export_stats[0]
    capsule = t.__dlpack__(stream=0x5000)
    taken = fast.export_stats[0] - hits
    assert taken == (1 if ACTIVE == "native" else 0), taken
    assert waited[0] == 0x5000 and server._exports.live == live + 1
    del capsule
    gc.collect()
    assert server._exports.live == live, "the lease went with the capsule"
    await client.sync()
    await client.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        dlpack_import_waits_on_the_legacy_stream,
        dlpack_import_keeps_the_producer_until_dropped,
        dlpack_calls_per_exchange,
        dlpack_export_in_one_call,
    )
}


if __name__ == "__main__":
    main(SCENARIOS)
