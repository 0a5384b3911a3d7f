"""Scenarios of the collectives' one-step route (``client/nccl_reduce.py``) on the real
client -> channel -> CudaServer path: two CUDA servers ("devices" 0 and 1) over the no-op
driver of ``benchmarks/bench_overhead.py`` and a recording fake NCCL library.

Run in its own process by ``tests/test_collectives_fake_cuda.py`` (the fake driver is
loaded into the process for good): ``python tests/fast_collective_scenario.py NAME``;
prints ``ok NAME`` or raises. ``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the
pure-Python twin.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_overhead

bench_overhead.install_fake()

import asynccube as ac  # noqa: E402
from asynccube._core.channel.channel import Channel  # noqa: E402
from asynccube._core.client.client import ComputeClient  # noqa: E402
from asynccube._core.cuda import driver, nccl  # noqa: E402
from asynccube._core.cuda.driver import DeviceContext  # noqa: E402
from asynccube._core.cuda.native.hotpath import ACTIVE  # noqa: E402
from asynccube._core.cuda.server import CudaServer  # noqa: E402
from asynccube._core.server.protocol import DeviceProperties  # noqa: E402

N = 1024
EXTRA = {
    "max_grid_dim": (2**31 - 1, 65535, 65535),
    "arch": "sm_80",
    "max_threads_per_block": 1024,
    "max_block_dim": (1024, 1024, 64),
    "max_shared_memory_per_block_optin": 227 << 10,
}


class Lib:
    """A fake NCCL: records each collective call and the thread it came from."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.threads: set[int] = set()
        self.fail = False

    def comm_init_all(self, devices: list[int]) -> list[int]:
        return [100 + d for d in devices]

    def comm_destroy(self, comm: int) -> None:
        pass

    def group_start(self) -> None:
        self.threads.add(threading.get_ident())

    def group_end(self) -> None:
        pass

    def all_reduce(self, *args: Any) -> None:
        self.calls.append(("all_reduce", *args))
        if self.fail:
            raise nccl.error(self, 5, "ncclAllReduce")

    def error_string(self, code: int) -> str:
        return "invalid usage"


LIB = Lib()
nccl._found[:] = ["fake-nccl"]
nccl.load = lambda path: LIB  # type: ignore[assignment]


class Setup:
    """Two clients of fake CUDA devices 0 and 1, a float32 buffer of N on each."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.clients = []
        for ordinal in (0, 1):
            props = DeviceProperties("fake", "cuda", 512, 16 << 30, dict(EXTRA))
            server = CudaServer(DeviceContext(ordinal, ordinal + 1, ordinal + 1), properties=props)
            self.clients.append(ComputeClient(server, loop))
        self.pairs = [(c, c.create(np.ones(N, np.float32))) for c in self.clients]

    async def warm(self) -> Setup:
        for _ in range(2):  # communicators made; the kind issued fast once
            await ac.all_reduce(self.pairs, "float32")
        LIB.calls.clear()
        LIB.threads.clear()
        return self

    def hits(self) -> list[int]:
        return [c._fast_sync.hits for c in self.clients]

    async def close(self) -> None:
        for c in self.clients:
            await c.close()


_COUNTED: list[tuple[Any, str, Any]] = []


def _count(target: Any, name: str) -> list[Any]:
    """Record the calls of ``target.name`` from now on (until :func:`_uncount`)."""
    calls: list[Any] = []
    real = getattr(target, name)
    _COUNTED.append((target, name, real))

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    setattr(target, name, counted)
    return calls


def _uncount() -> None:
    while _COUNTED:
        target, name, real = _COUNTED.pop()
        setattr(target, name, real)


async def one_step() -> None:
    """Both actors idle: the group is issued at the call, on the loop's thread, each rank
    with its buffer's address and its server's stream, as one command of the first
    client; each buffer is held until its stream passes the collective; the await
    settles through each client's one-call sync (FastSync), contexts switched a few
    times a call."""
    s = await Setup().warm()
    sends = _count(Channel, "send")
    switches = _count(driver._module, "cuCtxSetCurrent")
    hits = s.hits()
    done = ac.all_reduce(s.pairs, "float32")
    assert len(sends) == 1, [c[1].__name__ for c in sends]
    assert LIB.threads == {threading.get_ident()}, LIB.threads
    assert [c[0] for c in LIB.calls] == ["all_reduce", "all_reduce"]
    for (client, handle), call in zip(s.pairs, LIB.calls, strict=True):
        server = client.server
        ptr, count, _, _, comm, stream = call[1:]
        assert ptr == server._ptr(handle.binding()) and count == N
        assert comm == 100 + server.context.ordinal
        assert stream == int(server._streams.streams.get(ac.StreamId.current()).stream)
        held = [o for _, objs in server._retirer._parked.values() for o in objs]
        held += [o for q in server._retirer._inflight.values() for _, objs in q for o in objs]
        assert handle.memory.id in [getattr(o, "memory", o).id for o in held], held
    await done
    assert [h - k for h, k in zip(s.hits(), hits, strict=True)] == [1, 1]  # FastSync
    assert len(switches) <= 6, switches
    _uncount()
    await s.close()


async def queued_calls() -> None:
    """Ten calls back to back, then their awaitables: each in one step, in call order."""
    s = await Setup().warm()
    await ac.all_reduce(s.pairs, "float32", count=1000)  # the kind (512 to 1023) made fast
    LIB.calls.clear()
    sends = _count(Channel, "send")
    counts = [1000 + k for k in range(10)]
    done = [ac.all_reduce(s.pairs, "float32", count=k) for k in counts]
    assert len(sends) == 10, [c[1].__name__ for c in sends]
    assert [c[2] for c in LIB.calls] == [k for k in counts for _ in range(2)]
    for d in done:
        await d
    _uncount()
    await s.close()


async def busy_route() -> None:
    """The second client's actor awaits a job: the collective takes the commands' route
    (nothing issued at the call), then runs once the job ended; the await settles."""
    s = await Setup().warm()
    release = asyncio.get_running_loop().create_future()
    s.clients[1]._channel.send(lambda: release)
    done = ac.all_reduce(s.pairs, "float32")
    assert LIB.calls == []
    await asyncio.sleep(0.005)
    assert LIB.calls == []
    release.set_result(None)
    await done
    assert [c[0] for c in LIB.calls] == ["all_reduce", "all_reduce"]
    await s.close()


async def failure_held() -> None:
    """NCCL fails in one step: the await raises it for both clients, both buffers are
    tainted, and each client serves again once the buffer is written."""
    s = await Setup().warm()
    LIB.fail = True
    try:
        with pytest.raises(ac.CollectiveError, match="may have changed"):
            await ac.all_reduce(s.pairs, "float32")
    finally:
        LIB.fail = False
    for client, handle in s.pairs:
        await client.sync()
        with pytest.raises(ac.TaintedBuffer):
            await client.read([handle])
        client.write([(handle.copy_descriptor((4 * N,), (1,), 1), bytes(4 * N))])
        await client.read([handle])
    await s.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    f.__name__: f for f in (one_step, queued_calls, busy_route, failure_held)
}


def main() -> None:
    """Run the scenarios named on the command line (all without one)."""
    for name in sys.argv[1:] or list(SCENARIOS):
        asyncio.run(SCENARIOS[name]())
        print("ok", name, ACTIVE)


if __name__ == "__main__":
    main()
