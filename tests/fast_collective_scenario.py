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
import ctypes
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

N = 1024


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
            ctx = DeviceContext(ordinal, ordinal + 1, ordinal + 1)
            server = CudaServer(ctx, properties=bench_overhead.fake_properties())
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


def _current() -> int:
    """The context current on this thread, as the fake driver has it (not the mark)."""
    return int(driver._module.cuCtxGetCurrent()[1])


def _held(server: Any) -> list[int]:
    """The memory ids the server's retirer keeps (parked or in flight)."""
    held = [o for _, objs in server._retirer._parked.values() for o in objs]
    held += [o for q in server._retirer._inflight.values() for _, objs in q for o in objs]
    return [getattr(o, "memory", o).id for o in held]


class Switches:
    """Counts ``cuCtxSetCurrent`` through both routes: cuda.bindings' (the fake module)
    and the compiled hot path's (the fake library's own counter)."""

    def __init__(self) -> None:
        self._python = _count(driver._module, "cuCtxSetCurrent")
        bench_overhead.c_calls(driver._module._lib, reset=True)

    def take(self) -> int:
        lib = bench_overhead.c_calls(driver._module._lib, reset=True)
        out = len(self._python) + lib.get("cuCtxSetCurrent", 0)
        self._python.clear()
        return out


async def one_step() -> None:
    """Both actors idle: the group is issued at the call, on the loop's thread, each rank
    with its buffer's address and its server's stream, as one command of the first
    client; each buffer's last use is the collective (a handle dropped now keeps its
    slice until the stream passes it); the await settles in one look at the events the
    call recorded (the first client's FastSync), the first client's context current."""
    s = await Setup().warm()
    sends = _count(Channel, "send")
    hits = s.hits()
    done = ac.all_reduce(s.pairs, "float32")
    assert len(sends) == 1, [c[1].__name__ for c in sends]
    assert LIB.threads == {threading.get_ident()}, LIB.threads
    assert [c[0] for c in LIB.calls] == ["all_reduce", "all_reduce"]
    here = ac.StreamId.current()
    for (client, handle), call in zip(s.pairs, LIB.calls, strict=True):
        server = client.server
        ptr, count, _, _, comm, stream = call[1:]
        assert ptr == server._ptr(handle.binding()) and count == N
        assert comm == 100 + server.context.ordinal
        wrapper = server._streams.streams.get(here)
        assert stream == int(wrapper.stream)
        assert server._streams.last_use[handle.memory.id] == (here, wrapper.cursor)
        assert wrapper.done < wrapper.cursor  # not known done before the await
    first = s.clients[0].server._ctx.context
    assert _current() == int(first) and driver._tls.context is first
    await done
    assert [h - k for h, k in zip(s.hits(), hits, strict=True)] == [1, 0]  # one look
    for client, _ in s.pairs:
        wrapper = client.server._streams.streams.get(here)
        assert wrapper.done == wrapper.cursor  # marked done by the await
    assert _current() == int(first) and driver._tls.context is first
    _uncount()
    await s.close()


async def two_switches_a_call() -> None:
    """A warm awaited call switches contexts twice (to the second device for its side,
    back to the caller's), through either route; the await and the loop iteration's
    batch ends switch none (before: four, the second client's sync and batch end
    switching again); the caller's context is current after each call and each await."""
    s = await Setup().warm()
    first = s.clients[0].server._ctx.context
    switches = Switches()
    for k in range(10):
        done = ac.all_reduce(s.pairs, "float32")
        assert _current() == int(first), k
        await done
        assert _current() == int(first) and driver._tls.context is first, k
    assert switches.take() == 2 * 10
    _uncount()
    await s.close()


async def nccl_moves_the_context() -> None:
    """NCCL makes each device current in its group and, in the versions read, the one
    current before the group again: no switch is made for it. A library that left
    another context current is seen (``cuCtxGetCurrent``), not assumed: the caller's
    context is current after the call all the same."""
    s = await Setup().warm()
    contexts = [c.server._ctx.context for c in s.clients]
    first = contexts[0]
    end = LIB.group_end
    for restores in (True, False):

        def group_end(restores: bool = restores) -> None:
            before = driver._module.cuCtxGetCurrent()[1]
            for context in contexts[::-1]:  # the first's left current
                driver._module.cuCtxSetCurrent(context)
            if restores:
                driver._module.cuCtxSetCurrent(before)

        LIB.group_end = group_end  # type: ignore[method-assign]
        try:
            switches = Switches()
            done = ac.all_reduce(s.pairs, "float32")
            ours = switches.take() - len(contexts) - restores  # less NCCL's own
            assert _current() == int(first) and driver._tls.context is first, restores
            # restored: to the second's and back; else the second's again for its flush
            assert ours == (2 if restores else 3), (restores, ours)
            await done
        finally:
            LIB.group_end = end  # type: ignore[method-assign]
    _uncount()
    await s.close()


async def await_falls_back() -> None:
    """The one look settles the work the call was issued behind (a write issued on the
    second client since is left to its own await: its stream is marked done up to the
    collective only); it declines where the device has not passed the events (the
    fake's pending flag): each client's sync settles the await."""
    s = await Setup().warm()
    hits = s.hits()
    here = ac.StreamId.current()
    done = ac.all_reduce(s.pairs, "float32")
    client, handle = s.pairs[1]
    wrapper = client.server._streams.streams.get(here)
    collective_at = wrapper.cursor
    client.write([(handle.copy_descriptor((4 * N,), (1,), 1), bytes(4 * N))])
    await done
    assert [h - k for h, k in zip(s.hits(), hits, strict=True)] == [1, 0]  # one look
    assert wrapper.done == collective_at < wrapper.cursor  # the write: not yet known done
    await client.sync()
    assert wrapper.done == wrapper.cursor
    pending = ctypes.c_int.in_dll(driver._module._lib, "fake_pending")
    declined = s.clients[0]._fast_sync.declined
    done = ac.all_reduce(s.pairs, "float32")
    pending.value = 1  # the device is behind: no event reached
    try:
        await done
    finally:
        pending.value = 0
    assert s.clients[0]._fast_sync.declined > declined
    _uncount()
    await s.close()


async def dropped_buffer_kept() -> None:
    """A buffer whose last use is the one-step collective, dropped right after the call,
    keeps its slice until its stream passes the collective (no hold of its own: its
    last use was stamped before the group was issued)."""
    s = await Setup().warm()
    pairs = [(c, c.create(np.ones(N, np.float32))) for c in s.clients]
    for _ in range(2):
        await ac.all_reduce(pairs, "float32")
    ids = [h.memory.id for _, h in pairs]
    done = ac.all_reduce(pairs, "float32")
    pending = ctypes.c_int.in_dll(driver._module._lib, "fake_pending")
    pending.value = 1  # the device has not passed the collective
    try:
        del pairs
        for client, mid in zip(s.clients, ids, strict=True):
            client.server._collect()  # the dropped handle's slice: held, not freed
            assert mid in _held(client.server), (mid, _held(client.server))
    finally:
        pending.value = 0
    await done
    for client, mid in zip(s.clients, ids, strict=True):
        await client.sync()
        client.server._collect()
        assert mid not in _held(client.server)
    _uncount()
    await s.close()


async def queued_calls() -> None:
    """Ten calls back to back, then their awaitables: each in one step, in call order;
    each await settled by one look at its call's events (none by a sync per client)."""
    s = await Setup().warm()
    await ac.all_reduce(s.pairs, "float32", count=1000)  # the kind (512 to 1023) made fast
    LIB.calls.clear()
    sends = _count(Channel, "send")
    counts = [1000 + k for k in range(10)]
    hits = s.hits()
    done = [ac.all_reduce(s.pairs, "float32", count=k) for k in counts]
    assert len(sends) == 10, [c[1].__name__ for c in sends]
    assert [c[2] for c in LIB.calls] == [k for k in counts for _ in range(2)]
    for d in done:
        await d
    assert [h - k for h, k in zip(s.hits(), hits, strict=True)] == [10, 0]
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
    f.__name__: f
    for f in (
        one_step,
        two_switches_a_call,
        nccl_moves_the_context,
        await_falls_back,
        dropped_buffer_kept,
        queued_calls,
        busy_route,
        failure_held,
    )
}


def main() -> None:
    """Run the scenarios named on the command line (all without one)."""
    for name in sys.argv[1:] or list(SCENARIOS):
        asyncio.run(SCENARIOS[name]())
        print("ok", name, ACTIVE)


if __name__ == "__main__":
    main()
