"""``ac.broadcast``, ``ac.all_gather`` and ``ac.reduce_scatter`` across clients: results
against numpy oracles over random shapes, stream order, bad input refused at the call
with every client serving, failures held for each client's stream (host clients,
asyncio and trio; CUDA and two GPUs through NCCL under the ``cuda`` marker)."""

from __future__ import annotations

import contextlib
import gc
import random
import warnings
from collections.abc import Iterator
from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client import staged_reduce

from .test_all_reduce import FAIL, _need_nccl, clients, expected, inputs, same, two_gpus

pytestmark = pytest.mark.anyio

# numpy's first random generator and first array comparison import modules (tens of
# ms): made here, at collection, rather than in the first test's step on the loop.
np.testing.assert_array_equal(np.random.default_rng(0).integers(0, 1, 1), np.zeros(1))
DTYPES = ["float32", "float64", "float16", "int8", "uint16", "int32", "int64", "uint64"]


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def cases(seed: int, count: int) -> Iterator[random.Random]:
    """``count`` random generators, one per case (seeded: a failure reruns the same)."""
    for i in range(count):
        yield random.Random(seed * 1000 + i)


# -- results against numpy ------------------------------------------------------------


async def test_broadcast_copies_the_roots_bytes_into_every_buffer() -> None:
    async with clients("host", "host", "host", "host") as pool:
        for rng in cases(1, 12):
            cs = rng.sample(pool, rng.randint(1, 4))
            size = rng.randint(1, 300)
            root = rng.randrange(len(cs))
            count = rng.choice([None, 0, rng.randint(0, size)])
            data = [np.frombuffer(rng.randbytes(size), np.uint8) for _ in cs]
            hs = [c.create(d) for c, d in zip(cs, data, strict=True)]
            await ac.broadcast(list(zip(cs, hs, strict=True)), root=root, count=count)
            n = size if count is None else count
            for i, (c, h) in enumerate(zip(cs, hs, strict=True)):
                want = data[i].copy()
                want[:n] = data[root][:n]
                np.testing.assert_array_equal(await c.read_array(h, np.uint8), want)


async def test_all_gather_puts_input_i_at_chunk_i_of_every_output() -> None:
    async with clients("host", "host", "host", "host") as pool:
        for rng in cases(2, 10):
            cs = rng.sample(pool, rng.randint(1, 4))
            chunk = rng.randint(1, 200)
            data = [np.frombuffer(rng.randbytes(chunk), np.uint8) for _ in cs]
            ins = [c.create(d) for c, d in zip(cs, data, strict=True)]
            outs = [c.create(bytes(len(cs) * chunk)) for c in cs]
            await ac.all_gather(list(zip(cs, ins, outs, strict=True)))
            for c, h in zip(cs, outs, strict=True):
                np.testing.assert_array_equal(await c.read_array(h, np.uint8), np.concatenate(data))
            for c, h, d in zip(cs, ins, data, strict=True):
                np.testing.assert_array_equal(await c.read_array(h, np.uint8), d)  # inputs kept


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", ac.ReduceOp.MIN])
async def test_reduce_scatter_gives_client_i_the_reduction_of_chunk_i(op: str) -> None:
    async with clients("host", "host", "host", "host") as pool:
        for rng in cases(3, 8):
            cs = rng.sample(pool, rng.randint(1, 4))
            dtype, k = rng.choice(DTYPES), rng.randint(1, 50)
            n = len(cs)
            arrays = inputs(n, n * k, dtype)
            ins = [c.create(a) for c, a in zip(cs, arrays, strict=True)]
            outs = [c.create(bytes(k * np.dtype(dtype).itemsize)) for c in cs]
            await ac.reduce_scatter(list(zip(cs, ins, outs, strict=True)), np.dtype(dtype), op)
            want = expected(arrays, str(op))
            for i, (c, h) in enumerate(zip(cs, outs, strict=True)):
                got = await c.read_array(h, dtype)
                np.testing.assert_array_equal(got, want[i * k : (i + 1) * k])


async def test_large_buffers_gather_and_reduce_in_a_worker() -> None:
    n = (256 << 10) // 4  # 1 MiB in all across the inputs: the work leaves the loop
    async with clients("host", "host") as (c0, c1):
        a, b = np.arange(2 * n, dtype=np.float32), np.full(2 * n, 0.5, np.float32)
        assert a.nbytes * 2 >= staged_reduce.INLINE_BYTES
        ins = [c0.create(a), c1.create(b)]
        halves = [c0.create(bytes(4 * n)), c1.create(bytes(4 * n))]
        await ac.reduce_scatter([(c0, ins[0], halves[0]), (c1, ins[1], halves[1])], "float32")
        np.testing.assert_array_equal(await c0.read_array(halves[0], np.float32), (a + b)[:n])
        np.testing.assert_array_equal(await c1.read_array(halves[1], np.float32), (a + b)[n:])
        whole = [c0.create(bytes(16 * n)), c1.create(bytes(16 * n))]
        await ac.all_gather([(c0, ins[0], whole[0]), (c1, ins[1], whole[1])])
        for c, h in ((c0, whole[0]), (c1, whole[1])):
            np.testing.assert_array_equal(await c.read_array(h, np.float32), np.concatenate([a, b]))
        await ac.broadcast([(c0, ins[0]), (c1, ins[1])], root=1)
        np.testing.assert_array_equal(await c0.read_array(ins[0], np.float32), b)


async def test_commands_before_and_after_are_ordered_without_awaiting() -> None:
    async with clients("host", "host", "host") as cs:
        ins = [c.create(np.zeros(8, np.int32)) for c in cs]
        outs = [c.create(bytes(3 * 32)) for c in cs]
        for i, (c, h) in enumerate(zip(cs, ins, strict=True)):
            c.write([(h.copy_descriptor((32,), (1,), 1), np.full(8, i + 1, np.int32))])
        gathered = ac.all_gather(list(zip(cs, ins, outs, strict=True)))
        scattered = ac.reduce_scatter(
            [(c, o, i) for c, i, o in zip(cs, ins, outs, strict=True)], "int32", "max"
        )
        copied = ac.broadcast(list(zip(cs, ins, strict=True)), root=2)
        reads = [c.read_array(h, np.int32) for c, h in zip(cs, ins, strict=True)]
        for read in reads:  # each client's i-th chunk of the gather is i + 1: max is 3
            np.testing.assert_array_equal(await read, np.full(8, 3, np.int32))
        for done in (gathered, scattered, copied):
            await done


# -- bad input ----------------------------------------------------------------------------


async def test_bad_input_raises_at_the_call_and_every_client_keeps_serving() -> None:
    async with clients("host", "host") as (c0, c1):
        a0, a1 = c0.create(bytes(16)), c1.create(bytes(16))
        b0, b1 = c0.create(bytes(32)), c1.create(bytes(32))
        small = c1.create(bytes(8))
        odd0, odd1 = c0.create(bytes(6)), c1.create(bytes(6))
        pairs, gather, scatter = (
            [(c0, a0), (c1, a1)],
            [(c0, a0, b0), (c1, a1, b1)],
            [(c0, b0, a0), (c1, b1, a1)],
        )
        bc, ag, rs = ac.broadcast, ac.all_gather, ac.reduce_scatter
        arg, own = ac.InvalidArgument, ac.InvalidHandle
        bad: list[tuple[Any, tuple[Any, ...], dict[str, Any], type[Exception], str]] = [
            (bc, ([],), {}, arg, "non-empty"),
            (bc, ([(c0, a0), (c0, a0)],), {}, arg, "same host client"),
            (bc, ([(c0, a1), (c1, a0)],), {}, own, "does not belong"),
            (bc, ([(c0, a0), (c1, small)],), {}, arg, "one size"),
            (bc, (pairs,), {"root": 2}, arg, r"root must .*0 to 1"),
            (bc, (pairs,), {"root": -1}, arg, "root must"),
            (bc, (pairs,), {"root": True}, arg, "root must"),
            (bc, (pairs,), {"root": "0"}, arg, "root must"),
            (bc, (pairs,), {"count": 17}, arg, "count <= 16"),
            (bc, (pairs,), {"count": -1}, arg, "int >= 0"),
            (bc, ([(c0, a0, b0)],), {}, arg, r"\(client, handle\)"),
            (ag, ([(c0, a0)],), {}, arg, r"\(client, input, output\)"),
            (ag, ([(c0, a0, b0), (c1, small, b1)],), {}, arg, "one size"),
            (ag, ([(c0, a0, a0), (c1, a1, b1)],), {}, arg, "2 x 16 = 32"),
            (ag, ([(c0, a0, b0), (c1, a1, b0)],), {}, own, "does not belong"),
            (ag, ([(c0, a0, b0), (c0, a1, b1)],), {}, arg, "twice"),
            (ag, ([(c0, a0, "x")],), {}, arg, "Handle or Binding"),
            (ag, ([(object(), a0, b0)],), {}, arg, "must be a client"),
            (ag, ([(c0, b0, b0)],), {}, arg, "overlap"),
            (ag, ("nope",), {}, arg, "non-empty list"),
            (rs, (scatter, "c8"), {}, arg, "does not reduce"),
            (rs, (scatter, ">i4"), {}, arg, "does not reduce"),
            (rs, (scatter, "f4", "avg"), {}, arg, "op must"),
            (rs, ([(c0, b0, b0), (c1, b1, a1)], "f4"), {}, arg, "32 / 2 = 16"),
            (rs, ([(c0, b0, a0), (c1, small, a1)], "f4"), {}, arg, "one size"),
            (rs, ([(c0, odd0, a0), (c1, odd1, a1)], "f4"), {}, arg, "whole float32"),
            (rs, ([(c0, odd0, a0)], "f8"), {}, arg, "whole float64"),
            (rs, ([(c0, a0, a0)], "f4"), {}, arg, "overlap"),
            (rs, ([(c0, b0, a1), (c1, b1, a0)], "f4"), {}, own, "does not belong"),
            (rs, ((c0, b0, a0), "f4"), {}, arg, r"triples\[0\] must be"),
        ]
        for call, args, kwargs, exc, words in bad:
            with pytest.raises(exc, match=words):
                call(*args, **kwargs)
        await ac.broadcast(pairs)
        await ac.all_gather(gather)
        await ac.reduce_scatter(scatter, "float32")
        for c, h in ((c0, a0), (c1, a1), (c0, b0), (c1, b1)):
            assert await c.read([h]) == [bytes(h.binding().size)]
    for call, args in (
        (ac.broadcast, (pairs,)),
        (ac.all_gather, (gather,)),
        (ac.reduce_scatter, (scatter, "f4")),
    ):
        with pytest.raises(ac.ClientClosedError):
            call(*args)


# -- failures ------------------------------------------------------------------------


def _calls(c0: ac.ComputeClient, c1: ac.ComputeClient, hs: list[ac.Handle]) -> dict[str, Any]:
    """Each collective over ``hs`` (16-byte buffers; 32-byte outputs for the gather)."""
    return {
        "broadcast": lambda: ac.broadcast([(c0, hs[0]), (c1, hs[1])], root=1),
        "all_gather": lambda: ac.all_gather([(c0, hs[0], hs[2]), (c1, hs[1], hs[3])]),
        "reduce_scatter": lambda: ac.reduce_scatter([(c0, hs[2], hs[0]), (c1, hs[3], hs[1])], "f4"),
    }


def _tainted(
    c0: ac.ComputeClient, c1: ac.ComputeClient, name: str
) -> tuple[list[ac.Handle], ac.Handle]:
    """The buffers of :func:`_calls` (ones), and the one on ``c1`` that the collective
    ``name`` reads, tainted by a failing kernel."""
    hs = [c0.create(np.ones(4, np.float32)), c1.create(np.ones(4, np.float32))]
    hs += [c0.create(np.ones(8, np.float32)), c1.create(np.ones(8, np.float32))]
    bad = hs[1] if name == "broadcast" else hs[3 if name == "reduce_scatter" else 1]
    c1.execute(FAIL, ac.CubeCount(1), ac.Bindings().with_buffer(bad.binding()))
    return hs, bad


@pytest.mark.parametrize("name", ["broadcast", "all_gather", "reduce_scatter"])
async def test_a_failure_is_held_for_each_client_when_not_awaited(name: str) -> None:
    async with clients("host", "host") as (c0, c1):
        hs, bad = _tainted(c0, c1, name)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            _calls(c0, c1, hs)[name]()  # never awaited
            for c in (c0, c1):
                with pytest.raises(ac.CollectiveError, match=f"{name} over 2 client.* unchanged"):
                    await c.sync()
            gc.collect()
        assert sum(f"{name}() at" in str(w.message) for w in caught) == 1
        np.testing.assert_array_equal(await c0.read_array(hs[0], np.float32), np.ones(4))
        c1.write([(bad.copy_descriptor((bad.binding().size,), (1,), 1), bytes(bad.binding().size))])
        await _calls(c0, c1, hs)[name]()  # clean again: it runs


@pytest.mark.parametrize("name", ["broadcast", "all_gather", "reduce_scatter"])
async def test_an_awaited_failure_raises_once_naming_every_client(name: str) -> None:
    async with clients("host", "host") as (c0, c1):
        hs, _ = _tainted(c0, c1, name)
        with pytest.raises(ac.CollectiveError) as raised:
            await _calls(c0, c1, hs)[name]()
        assert any("another client" in n for n in getattr(raised.value, "__notes__", []))
        await c0.sync()  # taken: nothing held any more
        await c1.sync()


async def test_a_client_that_dies_fails_the_collectives_without_hanging() -> None:
    async with clients("host") as (c0,):
        c1 = await ac.connect("host")
        h0, h1, o0, o1 = (
            c0.create(bytes(8)),
            c1.create(bytes(8)),
            c0.create(bytes(16)),
            c1.create(bytes(16)),
        )
        c1._channel.kill_for_test(RuntimeError("boom"))
        with pytest.raises((ac.ClientDeadError, ac.CollectiveError)):
            await ac.all_gather([(c0, h0, o0), (c1, h1, o1)])
        with contextlib.suppress(ac.CollectiveError):
            await c0.sync()
        assert await c0.read([o0]) == [bytes(16)]
        await c1.close()


# -- CUDA (the lead runs these on the GPU machine) -----------------------------------


@pytest.mark.cuda
async def test_one_cuda_client_through_a_one_rank_communicator() -> None:
    _need_nccl()
    async with clients("cuda:0") as (c0,):
        x = np.arange(1 << 16, dtype=np.float32)
        h, out, half = c0.create(x), c0.create(bytes(x.nbytes)), c0.create(bytes(x.nbytes))
        await ac.broadcast([(c0, h)])
        await ac.all_gather([(c0, h, out)])
        await ac.reduce_scatter([(c0, out, half)], "float32", "max")
        for handle in (h, out, half):
            np.testing.assert_array_equal(await c0.read_array(handle, np.float32), x)


@pytest.mark.cuda
async def test_cuda_and_host_take_the_staged_path() -> None:
    arrays = inputs(2, 1 << 16, "float32")
    async with clients("cuda:0", "host") as cs:
        ins = [c.create(a) for c, a in zip(cs, arrays, strict=True)]
        outs = [c.create(bytes(2 * arrays[0].nbytes)) for c in cs]
        halves = [c.create(bytes(arrays[0].nbytes // 2)) for c in cs]
        await ac.all_gather(list(zip(cs, ins, outs, strict=True)))
        await ac.reduce_scatter(list(zip(cs, ins, halves, strict=True)), "float32")
        await ac.broadcast(list(zip(cs, ins, strict=True)), root=1)
        total = expected(arrays, "sum")
        for i, c in enumerate(cs):
            np.testing.assert_array_equal(
                await c.read_array(outs[i], np.float32), np.concatenate(arrays)
            )
            got = await c.read_array(halves[i], np.float32)
            np.testing.assert_array_equal(got, total[i * (1 << 15) : (i + 1) * (1 << 15)])
            np.testing.assert_array_equal(await c.read_array(ins[i], np.float32), arrays[1])


# Two GPUs: the data and the expected results are made in sync fixtures, off the loop
# (numpy over millions of elements takes milliseconds, and the loop-lag probe times every
# step of the test's own task); results are compared with ``same`` (well under 1 ms).


@pytest.fixture
def four_mib() -> list[np.ndarray]:
    return inputs(2, 1 << 20, "float32")


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("root", [0, 1])
async def test_two_gpus_broadcast_through_nccl(root: int, four_mib: list[np.ndarray]) -> None:
    _need_nccl()
    async with clients("cuda:0", "cuda:1") as cs:
        hs = [c.create(a) for c, a in zip(cs, four_mib, strict=True)]
        done = ac.broadcast(list(zip(cs, hs, strict=True)), root=root)
        reads = [c.read_array(h, np.float32) for c, h in zip(cs, hs, strict=True)]  # ordered after
        for read in reads:
            assert same(await read, four_mib[root])
        await done
        await ac.broadcast(list(zip(cs, hs, strict=True)), root=1 - root, count=0)


@pytest.fixture
def gathered(request: pytest.FixtureRequest) -> tuple[list[np.ndarray], np.ndarray]:
    size = request.node.callspec.params["size"]
    data = [np.frombuffer(random.Random(i).randbytes(size), np.uint8) for i in range(2)]
    return data, np.concatenate(data)


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("size", [1, 4099, 1 << 20])  # 8 MiB: its 16 MiB reads' copy back
# into new arrays ran 10 ms on the loop (the probe's limit is 5 ms), not the collective
async def test_two_gpus_all_gather_through_nccl(
    size: int, gathered: tuple[list[np.ndarray], np.ndarray]
) -> None:
    _need_nccl()
    data, want = gathered
    async with clients("cuda:0", "cuda:1") as cs:
        ins = [c.create(d) for c, d in zip(cs, data, strict=True)]
        outs = [c.empty(2 * size) for c in cs]  # not create(bytes): a 16 MiB copy on the loop
        done = ac.all_gather(list(zip(cs, ins, outs, strict=True)))
        reads = [c.read_array(h, np.uint8) for c, h in zip(cs, outs, strict=True)]
        for read in reads:
            assert same(await read, want)
        await done


K = 1 << 19


@pytest.fixture
def scattered(request: pytest.FixtureRequest) -> tuple[list[np.ndarray], list[np.ndarray]]:
    params = request.node.callspec.params
    arrays = inputs(2, 2 * K, params["dtype"])
    want = expected(arrays, params["op"])
    return arrays, [want[:K].copy(), want[K:].copy()]


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int16"])
@pytest.mark.parametrize("op", ["sum", "max"])
async def test_two_gpus_reduce_scatter_through_nccl(
    op: str, dtype: str, scattered: tuple[list[np.ndarray], list[np.ndarray]]
) -> None:
    _need_nccl()  # int16: NCCL has none, so the staged path
    arrays, want = scattered
    async with clients("cuda:0", "cuda:1") as cs:
        ins = [c.create(a) for c, a in zip(cs, arrays, strict=True)]
        outs = [c.create(bytes(K * np.dtype(dtype).itemsize)) for c in cs]
        done = ac.reduce_scatter(list(zip(cs, ins, outs, strict=True)), dtype, op)
        reads = [c.read_array(h, dtype) for c, h in zip(cs, outs, strict=True)]
        for read, chunk in zip(reads, want, strict=True):
            assert same(await read, chunk)
        await done


@pytest.fixture
def ones_twos() -> list[np.ndarray]:
    return [np.full(1 << 18, i + 1, np.float32) for i in range(2)]


@pytest.mark.cuda
@two_gpus
async def test_two_gpus_back_to_back_collectives_keep_stream_order(
    ones_twos: list[np.ndarray],
) -> None:
    _need_nccl()
    n = ones_twos[0].size
    six = np.full(n, 6, np.float32)
    async with clients("cuda:0", "cuda:1") as cs:
        a = [c.create(x) for c, x in zip(cs, ones_twos, strict=True)]
        g = [c.create(bytes(2 * 4 * n)) for c in cs]
        s = [c.create(bytes(4 * n)) for c in cs]
        pairs = list(zip(cs, a, strict=True))
        calls = [
            ac.all_reduce(pairs, "float32"),  # 3, 3
            ac.broadcast(pairs, root=0),  # 3, 3
            ac.all_gather(list(zip(cs, a, g, strict=True))),  # [3, 3]
            ac.reduce_scatter(list(zip(cs, g, s, strict=True)), "float32"),  # 6
        ]
        reads = [c.read_array(h, np.float32) for c, h in zip(cs, s, strict=True)]
        for read in reads:
            assert same(await read, six)
        for done in calls:
            await done


@pytest.mark.cuda
@two_gpus
async def test_two_gpus_warm_calls_in_one_step_see_every_earlier_write() -> None:
    """Warm (communicators made, each kind issued fast once), each call runs in one step
    at the call, on each client's stream: a write queued just before it by another task
    (another stream) or by this one is in the result, a read after it sees the result,
    call after call, and the awaits settle (each client's one-call sync)."""
    _need_nccl()
    n = 1 << 14
    async with clients("cuda:0", "cuda:1") as cs:
        hs = [c.create(np.zeros(n, np.float32)) for c in cs]
        pairs = list(zip(cs, hs, strict=True))
        g = [c.create(bytes(2 * 4 * n)) for c in cs]
        gathered = list(zip(cs, hs, g, strict=True))
        for _ in range(3):
            await ac.all_reduce(pairs, "float32")
            await ac.all_gather(gathered)

        def fill(i: int, value: float) -> None:
            h = hs[i]
            cs[i].write([(h.copy_descriptor((4 * n,), (1,), 1), np.full(n, value, np.float32))])

        async def elsewhere(value: float) -> None:  # another task: another stream
            fill(1, value)

        for step in range(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(elsewhere, float(step))
            fill(0, 1.0)
            done = ac.all_reduce(pairs, "float32")
            gather = ac.all_gather(gathered)
            reads = [c.read_array(h, np.float32) for c, h in zip(cs, g, strict=True)]
            want = np.full(2 * n, step + 1.0, np.float32)
            for read in reads:
                assert same(await read, want), step
            await done
            await gather


@pytest.mark.cuda
@two_gpus
async def test_two_gpus_a_warm_call_switches_twice_and_leaves_the_callers_context() -> None:
    """Warm, an awaited call in one step makes two ``cuCtxSetCurrent`` through either
    route (to the second device for its side, back to the first: NCCL needs none and,
    after its group, leaves current the context current before it, which is asked of
    the driver), the first client's context current after the call and after the await
    (the driver's answer and the mark agree), and each await is one look at its call's
    events (the device given the time to pass them); the result is right. (A call whose
    kind NCCL issued slowly last time takes the commands' route: not counted.)"""
    _need_nccl()
    from asynccube._core.cuda import driver
    from asynccube._core.cuda.native import hotpath

    n = 1 << 14
    async with clients("cuda:0", "cuda:1") as cs:
        hs = [c.create(np.full(n, i + 1, np.float32)) for i, c in enumerate(cs)]
        pairs = list(zip(cs, hs, strict=True))
        for _ in range(3):
            await ac.all_reduce(pairs, "float32")
        first = cs[0].server._ctx.context
        switches: list[Any] = []
        module, hot_set = driver._module, hotpath.hot.ctx_set

        class Counted:
            def __getattr__(self, name: str) -> Any:
                return getattr(module, name)

            def cuCtxSetCurrent(self, ctx: Any) -> Any:
                switches.append(ctx)
                return module.cuCtxSetCurrent(ctx)

        def counted_set(ctx: Any) -> Any:
            switches.append(ctx)
            return hot_set(ctx)

        def current() -> int:
            return int(driver.check(module.cuCtxGetCurrent(), "cuCtxGetCurrent"))

        driver._module = Counted()
        hotpath.hot.ctx_set = counted_set
        counted = 0
        try:
            for _ in range(10):
                cs[0]._channel.activate()  # as after a call in one step (a route's may not)
                switches.clear()
                looks = cs[0]._fast_sync.hits
                done = ac.all_reduce(pairs, "float32")
                one_step = done._settle is not None  # type: ignore[attr-defined]
                called = current()
                await anyio.sleep(0.002)  # the device passes it: the await's one look
                await done
                if one_step:
                    counted += 1
                    assert called == int(first)
                    assert current() == int(first) and driver._tls.context is first
                    assert len(switches) == 2, switches
                    assert cs[0]._fast_sync.hits == looks + 1
        finally:
            driver._module = module
            hotpath.hot.ctx_set = hot_set
        assert counted >= 5, counted
        want = np.full(n, 3 * 2**12, np.float32)  # 3 after the first call, then doubled
        for c, h in pairs:
            assert same(await c.read_array(h, np.float32), want)
