"""Scenarios of the expandable pool on the real client -> channel -> CudaServer path,
against the no-op driver of ``benchmarks/bench_overhead.py`` given the virtual memory
calls (``cuMemAddressReserve``, ``cuMemCreate``, ``cuMemMap``, ...) as recorders here.

Run in its own process by ``tests/test_fast_launch.py``: ``python
tests/fast_expandable_scenario.py NAME``; prints ``ok NAME`` or raises.
``ASYNCCUBE_NO_EXTENSIONS=1`` runs the same on the pure-Python twin of the one-call
allocation route (``FastLaunch.empty``), which must take the expandable pool's slices
as it takes the sliced pool's.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import types
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from asynccube._core.cuda import driver, storage
from asynccube._core.cuda.driver import DeviceContext
from asynccube._core.cuda.server import CudaServer
from asynccube._core.memory import MemoryConfig
from fast_launch_scenario import ADD, N, Setup, U, bench_overhead, main

SIZE = 4 * N
MiB = 1 << 20
CHUNK = 2 * MiB
BASE = 0x7F00_0000_0000


class Vmm:
    """The virtual memory calls of the fake driver: what is reserved, created, mapped
    (address -> handle), made accessible, unmapped (and on which thread) and freed."""

    def __init__(self) -> None:
        self.reserved: list[tuple[int, int]] = []
        self.handles: set[int] = set()
        self.mapped: dict[int, int] = {}
        self.access: list[tuple[int, int]] = []
        self.unmap_threads: set[str] = set()
        self.freed: list[tuple[int, int]] = []
        self._ids = itertools.count(1)

    def install(self, d: Any) -> None:
        """Put the calls on the fake driver ``d``."""
        d.CUmemAllocationProp = d.CUmemAccessDesc = _struct
        d.cuMemGetAllocationGranularity = lambda prop, option: (0, CHUNK)
        d.cuMemAddressReserve = self.reserve
        d.cuMemCreate = self.create
        d.cuMemMap = self.map
        d.cuMemSetAccess = self.set_access
        d.cuMemUnmap = self.unmap
        d.cuMemRelease = self.release
        d.cuMemAddressFree = self.free

    def reserve(self, size: int, align: int, addr: int, flags: int) -> tuple[int, int]:
        assert size % CHUNK == 0 and align == CHUNK, (size, align)
        self.reserved.append((BASE, size))
        return 0, BASE

    def create(self, size: int, prop: Any, flags: int) -> tuple[int, int]:
        assert size % CHUNK == 0 and prop.location.id == 0, size
        handle = next(self._ids)
        self.handles.add(handle)
        return 0, handle

    def map(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple[int]:
        chunks = range(ptr, ptr + size, CHUNK)
        assert size % CHUNK == 0 and ptr % CHUNK == 0, hex(ptr)
        assert not any(c in self.mapped for c in chunks), hex(ptr)
        self.mapped.update(dict.fromkeys(chunks, handle))  # chunk address -> handle
        return (0,)

    def set_access(self, ptr: int, size: int, desc: list[Any], count: int) -> tuple[int]:
        assert all(ptr + k in self.mapped for k in range(0, size, CHUNK)), hex(ptr)
        self.access.append((ptr, size))
        return (0,)

    def unmap(self, ptr: int, size: int) -> tuple[int]:
        chunks = range(ptr, ptr + size, CHUNK)
        handle = self.mapped.get(ptr)  # a whole mapping: one handle, nothing else
        assert handle is not None and [self.mapped.get(c) for c in chunks] == [handle] * len(
            chunks
        ), hex(ptr)
        assert sum(h == handle for h in self.mapped.values()) == len(chunks), hex(ptr)
        self.unmap_threads.add(threading.current_thread().name)
        for c in chunks:
            del self.mapped[c]
        return (0,)

    def release(self, handle: int) -> tuple[int]:
        assert handle in self.handles and handle not in self.mapped.values(), handle
        self.handles.discard(handle)
        return (0,)

    def free(self, ptr: int, size: int) -> tuple[int]:
        assert (ptr, size) in self.reserved and not self.mapped, (hex(ptr), self.mapped)
        self.freed.append((ptr, size))
        return (0,)


def _struct() -> Any:
    return types.SimpleNamespace(location=types.SimpleNamespace())


class ExpandableSetup(Setup):
    """:class:`Setup` on a CudaServer whose memory is one expandable pool."""

    def __init__(self) -> None:
        self.vmm = Vmm()
        self.vmm.install(driver._module)
        storage.vmm_supported = lambda device: True  # the fake answers 0 to every attribute
        made = bench_overhead._server
        bench_overhead._server = self._make_server  # what Setup builds its server with
        try:
            super().__init__()
        finally:
            bench_overhead._server = made

    @staticmethod
    def _make_server() -> Any:
        return CudaServer(
            DeviceContext(0, 1, 1),
            properties=bench_overhead.fake_properties(),
            memory=MemoryConfig.expandable(),
        )


def _pool(s: Setup) -> Any:
    (pool,) = s.server._memory.pools
    assert pool.kind == "expandable", pool
    return pool


async def expandable_taken() -> None:
    """A dropped slice of the expandable pool goes to the next handle of its size in
    one call, with its address; the pool's usage does not move; the handle works."""
    s = await ExpandableSetup().ready()
    c = s.client
    slices = s.server._table._slices
    h = c.empty(SIZE)
    c.execute(ADD, s.count, s.writing_to(h), U)
    await c.sync()
    token, address = slices[h.memory.id], s.server._addresses[h.memory.id]
    assert BASE <= address[0] < BASE + CHUNK, address  # carved from the range
    before = await c.memory_usage()
    del h
    hits, d0 = s.stats
    h = c.empty(SIZE)
    assert s.stats == (hits + 1, d0), s.stats
    assert slices[h.memory.id] is token and s.server._addresses[h.memory.id] == address
    assert await c.memory_usage() == before
    c.execute(ADD, s.count, s.writing_to(h), U)
    (data,) = await c.read([h])
    assert len(data) == SIZE
    await c.close()


async def expandable_grows_in_place() -> None:
    """Growing sizes extend the one range: the same base, chunks mapped at its end and
    made accessible; what is dropped is unmapped on a cleanup, at once and on the
    loop's thread (no device work waited for); closing frees the range on a thread of
    its own."""
    s = await ExpandableSetup().ready()
    c, vmm, pool = s.client, s.vmm, _pool(s)
    assert len(vmm.reserved) == 1
    handles = []
    for k in range(1, 6):
        h = c.empty(k * 3 * MiB + 100)
        c.execute(ADD, s.count, s.writing_to(h), U)
        handles.append(h)
    await c.sync()
    addresses = [s.server._ptr(h.binding()) for h in handles]
    assert addresses == sorted(addresses) and addresses[0] >= BASE, addresses
    assert all(b - a >= (k + 1) * 3 * MiB for k, (a, b) in enumerate(itertools.pairwise(addresses)))
    assert len(vmm.reserved) == 1  # grown in place: no second range
    assert sorted(vmm.mapped) == [BASE + k * CHUNK for k in range(len(vmm.mapped))]
    mapped = len(vmm.mapped)
    assert (await c.memory_usage()).bytes_reserved == mapped * CHUNK
    del handles[2:], h
    await c.sync()
    c.memory_cleanup()
    usage = await c.memory_usage()  # unmapped by the cleanup itself: nothing to wait for
    assert len(vmm.mapped) < mapped
    assert vmm.unmap_threads == {threading.current_thread().name}
    assert usage.bytes_reserved == len(vmm.mapped) * CHUNK and pool.releasing_chunks == 0
    assert max(vmm.mapped) < addresses[2] + CHUNK  # the tail went back
    del handles
    await c.close()
    for _ in range(200):
        if vmm.freed:
            break
        await asyncio.sleep(0.005)
    assert vmm.freed == vmm.reserved and not vmm.mapped and not vmm.handles


async def expandable_cleanup_race() -> None:
    """A growth right after a cleanup never maps a chunk still being unmapped."""
    s = await ExpandableSetup().ready()
    c = s.client
    for _ in range(20):
        hs = [c.empty(size) for size in (5 * MiB, 9 * MiB, 700_000)]
        del hs
        c.memory_cleanup()
        h = c.empty(11 * MiB)
        c.execute(ADD, s.count, s.writing_to(h), U)
        del h
    (data,) = await c.read([c.create(np.arange(N, dtype=np.float32))])
    assert len(data) == SIZE
    await c.close()


SCENARIOS: dict[str, Callable[[], Awaitable[None]]] = {
    "expandable_taken": expandable_taken,
    "expandable_grows_in_place": expandable_grows_in_place,
    "expandable_cleanup_race": expandable_cleanup_race,
}

if __name__ == "__main__":
    main(SCENARIOS)
