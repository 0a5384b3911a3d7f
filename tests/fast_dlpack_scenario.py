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
import gc
import pstats
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from asynccube._core.client import dlpack
from asynccube._core.client.client import ComputeClient
from asynccube._core.cuda import interop as cuda_interop
from fast_launch_scenario import ACTIVE, ac, main

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
    cut (issue 38), 75 and 56 after (the twin: 104 and 73, 95 and 69)."""
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
        assert exports <= 61, exports
    await client.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        dlpack_import_waits_on_the_legacy_stream,
        dlpack_import_keeps_the_producer_until_dropped,
        dlpack_calls_per_exchange,
    )
}


if __name__ == "__main__":
    main(SCENARIOS)
