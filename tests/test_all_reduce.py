"""``ac.all_reduce`` across clients: results against numpy, stream order, cancellation,
bad input, failures held for each client's stream (host clients here; CUDA under the
``cuda`` marker)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import warnings
from collections.abc import AsyncIterator

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.client import staged_reduce
from asynccube._core.cuda import nccl
from asynccube._core.runtime.devices import probe_gpus

from .kernels import SLOW_FILL

pytestmark = pytest.mark.asyncio

_GPUS = len(probe_gpus().devices)
two_gpus = pytest.mark.skipif(_GPUS < 2, reason=f"needs two CUDA GPUs ({_GPUS} found)")
UFUNCS = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}


def _boom(launch: ac.HostLaunch) -> None:
    raise RuntimeError("the kernel before all_reduce failed")


FAIL = ac.Kernel("test_all_reduce_fail", host=_boom)


@contextlib.asynccontextmanager
async def clients(*devices: str) -> AsyncIterator[list[ac.ComputeClient]]:
    opened = [await ac.connect(d) for d in devices]
    try:
        yield opened
    finally:
        for c in opened:
            await c.close()


def expected(arrays: list[np.ndarray], op: str) -> np.ndarray:
    out = arrays[0].copy()
    with np.errstate(all="ignore"):
        for a in arrays[1:]:
            UFUNCS[op](out, a, out=out)
    return out


def inputs(n_clients: int, n: int, dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(n_clients)
    kind = np.dtype(dtype)
    if kind.kind == "f":
        return [rng.uniform(-2, 2, n).astype(kind) for _ in range(n_clients)]
    lo, hi = (0, 5) if kind.kind == "u" else (-5, 5)
    return [rng.integers(lo, hi, n).astype(kind) for _ in range(n_clients)]


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", ac.ReduceOp.MAX])
@pytest.mark.parametrize(
    ("dtype", "n_clients"),
    [
        ("float32", 2),
        ("float64", 3),
        ("float16", 4),
        ("int8", 2),
        ("uint16", 3),
        ("int32", 4),
        ("int64", 2),
        ("uint64", 3),
    ],
)
async def test_every_op_and_dtype_matches_numpy(op: str, dtype: str, n_clients: int) -> None:
    n = 1000
    arrays = inputs(n_clients, n, dtype)
    async with clients(*["host"] * n_clients) as cs:
        hs = [c.create(a) for c, a in zip(cs, arrays, strict=True)]
        await ac.all_reduce(list(zip(cs, hs, strict=True)), np.dtype(dtype), op=op)
        want = expected(arrays, str(op))
        for c, h in zip(cs, hs, strict=True):
            np.testing.assert_array_equal(await c.read_array(h, dtype), want)


async def test_large_buffers_reduce_in_a_worker_and_count_limits_the_elements() -> None:
    n = (512 << 10) // 4  # 1 MiB in all: INLINE_BYTES, so the reduction leaves the loop
    assert n * 4 * 2 >= staged_reduce.INLINE_BYTES
    a, b = np.arange(n, dtype=np.float32), np.full(n, 0.5, np.float32)
    async with clients("host", "host") as (c0, c1):
        h0, h1 = c0.create(a), c1.create(b)
        await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        for c, h in ((c0, h0), (c1, h1)):
            np.testing.assert_array_equal(await c.read_array(h, np.float32), a + b)
        await ac.all_reduce([(c0, h0), (c1, h1)], "float32", op="max", count=4)
        got = await c1.read_array(h1, np.float32)
        np.testing.assert_array_equal(got[:4], (a + b)[:4])  # max of equal values
        np.testing.assert_array_equal(got, a + b)


async def test_commands_before_and_after_are_ordered_without_awaiting() -> None:
    async with clients("host", "host", "host") as cs:
        hs = [c.create(np.zeros(64, np.float32)) for c in cs]
        for i, (c, h) in enumerate(zip(cs, hs, strict=True)):
            c.write([(h.copy_descriptor((256,), (1,), 1), np.full(64, i + 1, np.float32))])
        done = ac.all_reduce(list(zip(cs, hs, strict=True)), "float32", "sum")
        reads = [c.read_array(h, np.float32) for c, h in zip(cs, hs, strict=True)]
        for read in reads:
            np.testing.assert_array_equal(await read, np.full(64, 6, np.float32))
        await done


async def test_it_waits_for_slow_work_queued_before_on_another_client() -> None:
    async with clients("host", "host") as (c0, c1):
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))
        fill = ac.Bindings().with_buffer(h1.binding()).with_scalar(np.float32, [0.05])
        c1.execute(SLOW_FILL, ac.CubeCount(1), fill.with_scalar(np.uint8, [1]))
        await ac.all_reduce([(c0, h0), (c1, h1)], "uint8")
        assert await c0.read([h0]) == [b"\x01" * 16]


async def test_one_client_alone_is_the_identity() -> None:
    async with clients("host") as (c0,):
        h = c0.create(np.arange(8, dtype=np.int32))
        await ac.all_reduce([(c0, h)], "int32", op="prod")
        await ac.all_reduce([(c0, h)], "int32", count=0)
        np.testing.assert_array_equal(await c0.read_array(h, np.int32), np.arange(8))


async def test_cancelling_the_awaiting_task_neither_hangs_nor_leaks() -> None:
    n = (512 << 10) // 4
    async with clients("host", "host") as (c0, c1):
        before = [await c.memory_usage() for c in (c0, c1)]
        h0, h1 = c0.create(np.ones(n, np.float32)), c1.create(np.ones(n, np.float32))

        async def reduce(pairs: list[tuple[ac.ComputeClient, ac.Handle]]) -> None:
            await ac.all_reduce(pairs, "float32")

        task = asyncio.ensure_future(reduce([(c0, h0), (c1, h1)]))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        np.testing.assert_array_equal(await c1.read_array(h1, np.float32), np.full(n, 2.0))
        del h0, h1, task
        for c in (c0, c1):
            await c.sync()
        after = [await c.memory_usage() for c in (c0, c1)]
        assert [u.bytes_in_use for u in after] == [u.bytes_in_use for u in before]


async def test_bad_input_raises_and_every_client_keeps_serving() -> None:
    async with clients("host", "host") as (c0, c1):
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))
        small = c1.create(bytes(8))
        odd = c1.create(bytes(15))
        odd0 = c0.create(bytes(15))
        bad = [
            ([], "float32", {}, ac.InvalidArgument, "non-empty"),
            ([(c0, h0), (c0, h0)], "float32", {}, ac.InvalidArgument, "same host client twice"),
            ([(c0, h1), (c1, h0)], "float32", {}, ac.InvalidHandle, "does not belong"),
            ([(c0, h0), (c1, small)], "float32", {}, ac.InvalidArgument, "one size"),
            ([(c0, odd0), (c1, odd)], "float32", {}, ac.InvalidArgument, "whole number"),
            ([(c0, h0), (c1, h1)], "float32", {"count": 5}, ac.InvalidArgument, "count <= 4"),
            ([(c0, h0), (c1, h1)], "float32", {"count": -1}, ac.InvalidArgument, "int >= 0"),
            ([(c0, h0), (c1, h1)], "complex64", {}, ac.InvalidArgument, "does not reduce"),
            ([(c0, h0), (c1, h1)], "no such", {}, ac.InvalidArgument, "does not reduce"),
            ([(c0, h0), (c1, h1)], ">f4", {}, ac.InvalidArgument, "does not reduce"),
            ([(c0, h0), (c1, h1)], "float32", {"op": "avg"}, ac.InvalidArgument, "op must"),
            ([(c0, "x")], "float32", {}, ac.InvalidArgument, "Handle or Binding"),
            ([(object(), h0)], "float32", {}, ac.InvalidArgument, "must be a client"),
            ([c0], "float32", {}, ac.InvalidArgument, "(client, handle)"),
        ]
        for pairs, dtype, kw, exc, words in bad:
            with pytest.raises(exc, match=words.replace("(", r"\(").replace(")", r"\)")):
                ac.all_reduce(pairs, dtype, **kw)  # type: ignore[arg-type]
        await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        assert await c0.read([h0]) == [bytes(16)]
        assert await c1.read([h1]) == [bytes(16)]
    with pytest.raises(ac.ClientClosedError):
        ac.all_reduce([(c0, h0), (c1, h1)], "float32")


async def test_a_failure_is_held_for_each_client_when_not_awaited() -> None:
    async with clients("host", "host") as (c0, c1):
        h0, h1 = c0.create(np.ones(4, np.float32)), c1.create(np.ones(4, np.float32))
        c1.execute(FAIL, ac.CubeCount(1), ac.Bindings().with_buffer(h1.binding()))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            ac.all_reduce([(c0, h0), (c1, h1)], "float32")  # never awaited
            for c in (c0, c1):
                with pytest.raises(ac.CollectiveError, match="unchanged") as raised:
                    await c.sync()
                assert isinstance(raised.value.__cause__, (ac.ExecutionError, ac.TaintedBuffer))
            gc.collect()
        assert sum("never awaited" in str(w.message) for w in caught) == 1
        np.testing.assert_array_equal(await c0.read_array(h0, np.float32), np.ones(4))
        await c0.sync()
        await c1.sync()
        c1.write([(h1.copy_descriptor((16,), (1,), 1), np.full(4, 2, np.float32))])
        await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        np.testing.assert_array_equal(await c1.read_array(h1, np.float32), np.full(4, 3.0))


async def test_an_awaited_failure_raises_once_naming_every_client() -> None:
    async with clients("host", "host") as (c0, c1):
        h0, h1 = c0.create(np.ones(4, np.float32)), c1.create(np.ones(4, np.float32))
        c0.execute(FAIL, ac.CubeCount(1), ac.Bindings().with_buffer(h0.binding()))
        with pytest.raises(ac.CollectiveError) as raised:
            await ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        assert any("another client" in n for n in getattr(raised.value, "__notes__", []))
        await c0.sync()  # taken: nothing held any more
        await c1.sync()


async def test_a_client_that_dies_fails_the_reduction_without_hanging() -> None:
    async with clients("host") as (c0,):
        c1 = await ac.connect("host")
        h0, h1 = c0.create(bytes(8)), c1.create(bytes(8))
        c1._channel.kill_for_test(RuntimeError("boom"))
        with pytest.raises((ac.ClientDeadError, ac.CollectiveError)):
            await ac.all_reduce([(c0, h0), (c1, h1)], "int32")
        with contextlib.suppress(ac.CollectiveError):
            await c0.sync()
        assert await c0.read([h0]) == [bytes(8)]
        await c1.close()


# -- CUDA (the lead runs these on the GPU machine) -----------------------------------


def _need_nccl() -> None:
    if nccl.find_library() is None:
        pytest.skip("NCCL not found (install nvidia-nccl-cu12/-cu13 or torch)")


@pytest.mark.cuda
async def test_one_cuda_client_through_a_one_rank_communicator() -> None:
    _need_nccl()
    async with clients("cuda:0") as (c0,):
        x = np.arange(1 << 16, dtype=np.float32)
        h = c0.create(x)
        await ac.all_reduce([(c0, h)], "float32")
        np.testing.assert_array_equal(await c0.read_array(h, np.float32), x)


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["sum", "min", "max"])
async def test_cuda_and_host_take_the_staged_path(op: str) -> None:
    arrays = inputs(2, 1 << 16, "float32")
    async with clients("cuda:0", "host") as (c0, c1):
        hs = [c0.create(arrays[0]), c1.create(arrays[1])]
        await ac.all_reduce([(c0, hs[0]), (c1, hs[1])], "float32", op)
        for c, h in zip((c0, c1), hs, strict=True):
            np.testing.assert_array_equal(await c.read_array(h, np.float32), expected(arrays, op))


@pytest.mark.cuda
async def test_two_clients_of_one_device_are_refused() -> None:
    async with clients("cuda:0", "cuda:0") as (c0, c1):
        h0, h1 = c0.create(bytes(16)), c1.create(bytes(16))
        with pytest.raises(ac.InvalidArgument, match="one client per device"):
            ac.all_reduce([(c0, h0), (c1, h1)], "float32")
        assert await c1.read([h1]) == [bytes(16)]


@pytest.fixture
def case(request: pytest.FixtureRequest) -> tuple[list[np.ndarray], np.ndarray]:
    """Two inputs of 1M elements of the test's ``dtype`` and their reduction by its
    ``op``, made here, off the loop: numpy over 1M elements takes milliseconds, and the
    loop-lag probe times every step of the test's own task."""
    params = request.node.callspec.params
    arrays = inputs(2, 1 << 20, params["dtype"])
    return arrays, expected(arrays, str(params["op"]))


def same(got: np.ndarray, want: np.ndarray) -> bool:
    """``got == want`` everywhere, in well under a millisecond for 1M elements (on the
    loop: ``np.testing.assert_array_equal`` takes over 10 ms there). Floats are compared
    bit for bit first (numpy compares float16 element by element in software: several
    ms for 1M), the values only where the bits differ (0.0 and -0.0)."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return False
    if want.dtype.kind == "f":
        bits = np.dtype(f"u{want.dtype.itemsize}")
        if np.array_equal(got.view(bits), want.view(bits)):
            return True
    return bool(np.array_equal(got, want))


@pytest.mark.cuda
@two_gpus
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "int16"])
@pytest.mark.parametrize("op", ["sum", "min", "max"])
async def test_two_gpus_through_nccl(
    op: str, dtype: str, case: tuple[list[np.ndarray], np.ndarray]
) -> None:
    _need_nccl()  # int16: NCCL has none, so the staged path
    arrays, want = case
    async with clients("cuda:0", "cuda:1") as cs:
        hs = [c.create(a) for c, a in zip(cs, arrays, strict=True)]
        done = ac.all_reduce(list(zip(cs, hs, strict=True)), dtype, op)
        reads = [c.read_array(h, dtype) for c, h in zip(cs, hs, strict=True)]  # ordered after
        for read in reads:
            assert same(await read, want)
        await done
