"""Concurrent tasks on concurrent streams, through the client on the host server.

Every asyncio task gets its own stream (a worker thread on the host server), so these
tests really race: a missing cross-stream wait shows up as stale data.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy.testing import assert_array_equal

import asynccube as ac

from .kernels import SLOW_FILL
from .lagprobe import MAX_LAG_SECONDS, LoopLagProbe

N = 16  # float32 elements per buffer in the program tests
ONE = ac.CubeCount(1)


# -- kernels: each sleeps for its first float32 scalar (releasing the GIL) first -----------


def _delay(launch: ac.HostLaunch) -> None:
    delay = float(launch.scalar(np.float32, 0))
    if delay > 0:
        time.sleep(delay)


def _copy_host(launch: ac.HostLaunch) -> None:
    _delay(launch)
    src, dst = launch.buffers
    dst[:] = src


def _affine_host(launch: ac.HostLaunch) -> None:
    _delay(launch)
    (x,) = (b.view(np.float32) for b in launch.buffers)
    a, b = (np.float32(launch.scalar(np.float32, i)) for i in (1, 2))
    x[:] = x * a + b


def _add_host(launch: ac.HostLaunch) -> None:
    _delay(launch)
    a, b, out = (buf.view(np.float32) for buf in launch.buffers)
    out[:] = a + b


COPY = ac.Kernel("test_streams_copy", host=_copy_host)
"""buffers (src, dst), float32 (delay,): dst = src."""
AFFINE = ac.Kernel("test_streams_affine", host=_affine_host)
"""buffers (x,), float32 (delay, a, b): x = x * a + b, in place."""
ADD = ac.Kernel("test_streams_add", host=_add_host)
"""buffers (a, b, out), float32 (delay,): out = a + b."""


def copy_bindings(src: ac.Handle, dst: ac.Handle, delay: float = 0.0) -> ac.Bindings:
    return (
        ac.Bindings().with_buffers([src.binding(), dst.binding()]).with_scalar(np.float32, [delay])
    )


def affine_bindings(x: ac.Handle, a: float, b: float, delay: float = 0.0) -> ac.Bindings:
    return ac.Bindings().with_buffer(x.binding()).with_scalar(np.float32, [delay, a, b])


def add_bindings(a: ac.Handle, b: ac.Handle, out: ac.Handle, delay: float = 0.0) -> ac.Bindings:
    return (
        ac.Bindings()
        .with_buffers([a.binding(), b.binding(), out.binding()])
        .with_scalar(np.float32, [delay])
    )


def fill_bindings(x: ac.Handle, value: int, delay: float) -> ac.Bindings:
    return (
        ac.Bindings()
        .with_buffer(x.binding())
        .with_scalar(np.float32, [delay])
        .with_scalar(np.uint8, [value])
    )


def slot(handle: ac.Handle, client: ac.ComputeClient) -> int:
    """The stream slot (worker) ``handle`` was minted on."""
    max_streams: int = client.properties.extra["max_streams"]
    return handle.stream.value % max_streams


# -- the race: a slow writer on one stream, a reader on another ------------------------------

RACE_ITERATIONS = 1000
RACE_BATCH = 25
RACE_BYTES = 256


async def _race_once(client: ac.ComputeClient, i: int) -> tuple[bytes, int, bool]:
    """Task A fills a fresh zeroed buffer slowly; task B, launched after A's kernel was
    queued, copies it to its own buffer and reads that. Returns (what B read, A's byte,
    whether A and B ran on different workers)."""
    value = i % 251 + 1
    delay = (i % 5) * 50e-6  # 0 to 200 µs
    queued = asyncio.Event()
    shared: list[ac.Handle] = []

    async def task_a() -> None:
        x = client.create(bytes(RACE_BYTES))
        client.execute(SLOW_FILL, ONE, fill_bindings(x, value, delay))
        shared.append(x)
        queued.set()

    async def task_b() -> tuple[bytes, bool]:
        await queued.wait()
        (x,) = shared
        y = client.empty(RACE_BYTES)
        client.execute(COPY, ONE, copy_bindings(x, y))
        (data,) = await client.read([y.binding()])
        return data, slot(x, client) != slot(y, client)

    _, (data, crossed) = await asyncio.gather(task_a(), task_b())
    return data, value, crossed


@pytest.mark.asyncio
async def test_reader_on_another_stream_sees_the_slow_writer(
    host_client: ac.ComputeClient,
) -> None:
    crossed = 0
    stale: list[int] = []
    for start in range(0, RACE_ITERATIONS, RACE_BATCH):
        runs = await asyncio.gather(
            *(_race_once(host_client, i) for i in range(start, start + RACE_BATCH))
        )
        for i, (data, value, cross) in enumerate(runs, start):
            if data != bytes([value]) * RACE_BYTES:
                stale.append(i)
            crossed += cross
    assert not stale, f"{len(stale)} of {RACE_ITERATIONS} iterations read stale data: {stale[:8]}"
    # Each task has its own stream; most pairs land on different workers.
    assert crossed > RACE_ITERATIONS // 2


@pytest.mark.asyncio
async def test_gather_runs_each_coroutine_on_its_own_stream(
    host_client: ac.ComputeClient,
) -> None:
    async def mint() -> ac.StreamId:
        return host_client.empty(4).stream

    streams = await asyncio.gather(*(mint() for _ in range(8)))
    assert len(set(streams)) == 8


# -- order within a stream under load ---------------------------------------------------------


async def _ordered_chain(client: ac.ComputeClient, seed: int, ops: int) -> None:
    """A long chain of in-place, order-sensitive work on one stream, with slow kernels
    that later fast ones would overtake if order were lost; checked at reads along the
    way and at the end."""
    rng = random.Random(seed)
    expected = np.zeros(N, np.float32)
    x = client.create(expected)
    checks: list[tuple[asyncio.Future[list[bytes]], np.ndarray[Any, Any]]] = []
    for _ in range(ops):
        kind = rng.random()
        delay = rng.choice([0.0, 0.0, 0.0, 50e-6, 300e-6])
        if kind < 0.2:
            data = np.full(N, rng.randint(-4, 4), np.float32)
            client.write([(x.copy_descriptor((N,), (1,), 4), data)])
            expected = data
        elif kind < 0.8:
            a, b = rng.choice([-1.0, 0.5, 2.0]), float(rng.randint(-3, 3))
            client.execute(AFFINE, ONE, affine_bindings(x, a, b, delay))
            expected = expected * np.float32(a) + np.float32(b)
        else:
            checks.append((client.read([x.binding()]), expected.copy()))
        await asyncio.sleep(0)  # interleave with the other tasks at every step
    checks.append((client.read([x.binding()]), expected.copy()))
    for fut, want in checks:
        (raw,) = await fut
        assert_array_equal(np.frombuffer(raw, np.float32), want)


async def _noise(client: ac.ComputeClient, stop: asyncio.Event) -> int:
    """Unrelated work on its own stream until ``stop``."""
    a, b = (client.create(np.ones(N, np.float32)) for _ in range(2))
    out = client.empty(4 * N)
    rounds = 0
    while not stop.is_set():
        client.execute(ADD, ONE, add_bindings(a, b, out, 200e-6))
        if rounds % 4 == 0:
            await client.read([out.binding()])
        else:
            await asyncio.sleep(0)
        rounds += 1
    return rounds


@pytest.mark.asyncio
async def test_order_within_a_stream_is_kept_under_load(host_client: ac.ComputeClient) -> None:
    stop = asyncio.Event()
    noise = [asyncio.create_task(_noise(host_client, stop)) for _ in range(4)]
    try:
        await asyncio.gather(*(_ordered_chain(host_client, seed, 300) for seed in range(4)))
    finally:
        stop.set()
        rounds = await asyncio.gather(*noise)
    assert all(r > 0 for r in rounds)


# -- hypothesis: random DAGs of kernels over shared buffers, spread over tasks ----------------


@dataclass(frozen=True)
class Op:
    """One step of a program, run by task ``task``.

    ``kind`` is "write" (dst <- fill), "affine" (dst = dst * a + b), "add"
    (dst = src[0] + src[1]), "copy" (dst = src[0]) or "read" (check src[0])."""

    task: int
    kind: str
    dst: int
    src: tuple[int, ...] = ()
    a: float = 1.0
    b: float = 0.0
    delay: float = 0.0

    def buffers(self) -> set[int]:
        return {*self.src, self.dst} if self.kind != "read" else set(self.src)


@st.composite
def programs(draw: st.DrawFn) -> tuple[int, int, list[Op]]:
    tasks = draw(st.integers(2, 4))
    nbuf = draw(st.integers(2, 4))
    buf = st.integers(0, nbuf - 1)
    delay = st.sampled_from([0.0, 0.0, 50e-6, 500e-6])
    ops: list[Op] = []
    for _ in range(draw(st.integers(1, 24))):
        task = draw(st.integers(0, tasks - 1))
        kind = draw(st.sampled_from(["write", "affine", "affine", "add", "copy", "read"]))
        dst = draw(buf)
        if kind == "write":
            ops.append(Op(task, kind, dst, b=float(draw(st.integers(-4, 4)))))
        elif kind == "affine":
            a = draw(st.sampled_from([-1.0, 0.5, 2.0]))
            ops.append(
                Op(task, kind, dst, a=a, b=float(draw(st.integers(-3, 3))), delay=draw(delay))
            )
        elif kind == "add":
            others = st.sampled_from([i for i in range(nbuf) if i != dst])
            ops.append(Op(task, kind, dst, (draw(others), draw(others)), delay=draw(delay)))
        elif kind == "copy":
            source = draw(st.sampled_from([i for i in range(nbuf) if i != dst]))
            ops.append(Op(task, kind, dst, (source,), delay=draw(delay)))
        else:
            ops.append(Op(task, kind, -1, (dst,)))
    return tasks, nbuf, ops


def initial(nbuf: int) -> list[np.ndarray[Any, Any]]:
    return [np.arange(N, dtype=np.float32) * np.float32(i + 1) for i in range(nbuf)]


def simulate(nbuf: int, ops: Sequence[Op]) -> tuple[list[np.ndarray[Any, Any]], dict[int, Any]]:
    """The program run sequentially with numpy: final buffers and each read's value."""
    state = initial(nbuf)
    reads: dict[int, Any] = {}
    for i, op in enumerate(ops):
        if op.kind == "write":
            state[op.dst] = np.full(N, op.b, np.float32)
        elif op.kind == "affine":
            state[op.dst] = state[op.dst] * np.float32(op.a) + np.float32(op.b)
        elif op.kind == "add":
            state[op.dst] = state[op.src[0]] + state[op.src[1]]
        elif op.kind == "copy":
            state[op.dst] = state[op.src[0]].copy()
        else:
            reads[i] = state[op.src[0]].copy()
    return state, reads


def submit(client: ac.ComputeClient, op: Op, handles: list[ac.Handle]) -> Any:
    """Queue ``op``; a read returns its future."""
    dst = handles[op.dst] if op.dst >= 0 else None
    if op.kind == "write":
        assert dst is not None
        data = np.full(N, op.b, np.float32)
        client.write([(dst.copy_descriptor((N,), (1,), 4), data)])
    elif op.kind == "affine":
        assert dst is not None
        client.execute(AFFINE, ONE, affine_bindings(dst, op.a, op.b, op.delay))
    elif op.kind == "add":
        assert dst is not None
        a, b = (handles[s] for s in op.src)
        client.execute(ADD, ONE, add_bindings(a, b, dst, op.delay))
    elif op.kind == "copy":
        assert dst is not None
        client.execute(COPY, ONE, copy_bindings(handles[op.src[0]], dst, op.delay))
    else:
        return client.read([handles[op.src[0]].binding()])
    return None


async def run_program(tasks: int, nbuf: int, ops: Sequence[Op]) -> None:
    """Run ``ops`` spread over ``tasks`` tasks; each op is queued only after every
    earlier op sharing a buffer with it (the DAG's happens-before), then compare every
    read and the final buffers with :func:`simulate`."""
    final, reads = simulate(nbuf, ops)
    queued = [asyncio.Event() for _ in ops]
    after = [[j for j in range(i) if ops[j].buffers() & op.buffers()] for i, op in enumerate(ops)]
    async with ac.open_client("host") as client:
        handles = [client.create(data) for data in initial(nbuf)]

        async def task(t: int) -> dict[int, bytes]:
            pending = {}
            for i, op in enumerate(ops):
                if op.task != t:
                    continue
                for j in after[i]:
                    await queued[j].wait()
                fut = submit(client, op, handles)
                if fut is not None:
                    pending[i] = fut
                queued[i].set()
            return {i: (await fut)[0] for i, fut in pending.items()}

        results = await asyncio.gather(*(task(t) for t in range(tasks)))
        seen = {i: raw for r in results for i, raw in r.items()}
        for i, want in reads.items():
            got = np.frombuffer(seen[i], np.float32)
            assert_array_equal(got, want, err_msg=f"read at op {i}")
        out = await client.read([h.binding() for h in handles])
        for k, (raw, want) in enumerate(zip(out, final, strict=True)):
            assert_array_equal(np.frombuffer(raw, np.float32), want, f"buffer {k}")


async def _probed(coro: Coroutine[Any, Any, None]) -> None:
    probe = LoopLagProbe()
    probe.start()
    try:
        await coro
    finally:
        worst = await probe.stop()
    assert worst <= MAX_LAG_SECONDS, f"the loop was blocked {worst * 1e3:.1f} ms by {probe.culprit}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_random_dags_match_numpy(program: tuple[int, int, list[Op]]) -> None:
    # A loop per example (pytest-asyncio's loop and hypothesis do not mix with the suite's
    # lag-probe wrapper), with the same 5 ms lag limit.
    asyncio.run(_probed(run_program(*program)))


@pytest.mark.asyncio
async def test_a_known_dag_matches_numpy() -> None:
    """A fixed program mixing every op kind over three buffers and three tasks."""
    ops = [
        Op(0, "affine", 0, a=2.0, b=1.0, delay=500e-6),
        Op(1, "add", 1, (0, 2)),
        Op(2, "read", -1, (1,)),
        Op(2, "copy", 0, (1,), delay=500e-6),
        Op(0, "read", -1, (0,)),
        Op(1, "write", 2, b=3.0),
        Op(0, "add", 2, (0, 1), delay=50e-6),
        Op(2, "affine", 1, a=-1.0, b=0.0),
    ]
    await run_program(3, 3, ops)


# -- a dropped handle's memory is not reused while another stream still reads it --------------


async def _drop_while_read(client: ac.ComputeClient, delay: float) -> tuple[bytes, bytes]:
    size = 4096
    old, new = bytes([7]) * size, bytes([9]) * size
    holder = [client.create(old)]
    launched = asyncio.Event()

    async def task_b() -> bytes:
        y = client.empty(size)
        client.execute(COPY, ONE, copy_bindings(holder[0], y, delay))  # slow read of x
        launched.set()
        (data,) = await client.read([y.binding()])
        return data

    async def task_a() -> bytes:
        await launched.wait()
        await client.memory_usage()  # the actor has run B's execute by now
        holder.clear()  # the last handle to x is gone
        z = client.create(new)  # same size: the first candidate for x's memory
        (data,) = await client.read([z.binding()])
        return data

    return await asyncio.gather(task_b(), task_a())


@pytest.mark.asyncio
async def test_dropped_buffer_is_not_reused_while_another_stream_reads_it(
    host_client: ac.ComputeClient,
) -> None:
    for delay in (0.0, 1e-3, 20e-3):
        read_by_b, read_by_a = await _drop_while_read(host_client, delay)
        assert read_by_a == bytes([9]) * 4096
        assert read_by_b == bytes([7]) * 4096, f"x was reused while B read it ({delay=})"


@pytest.mark.asyncio
async def test_dropped_buffer_memory_is_reused_afterwards(host_client: ac.ComputeClient) -> None:
    await _drop_while_read(host_client, 1e-3)
    await host_client.sync()
    before = (await host_client.memory_usage()).bytes_reserved
    for _ in range(20):
        await _drop_while_read(host_client, 0.0)
    await host_client.sync()
    assert (await host_client.memory_usage()).bytes_reserved == before
