"""Kernels written once on a GPU (``cuda:0``): the same results as numpy (and as the
host server) for elementwise kernels and reductions of every size."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asynccube as ac

pytestmark = [pytest.mark.cuda, pytest.mark.asyncio, pytest.mark.allow_loop_lag]

DTYPES = ["bool", "int8", "int32", "int64", "uint32", "uint64", "float16", "float32", "float64"]


def _data(dtype: str, n: int) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(n)
    if dtype == "bool":
        return rng.random(n) > 0.5
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(n) * 4).astype(dtype)
    return rng.integers(0 if dtype[0] == "u" else -50, 50, n).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_elementwise_matches_numpy_on_the_gpu(dtype: str) -> None:
    x, y = _data(dtype, 100_003), _data(dtype, 77)[:1].repeat(100_003)
    kernel = ac.elementwise("s = maximum(x, y); c = x < y; m = x * y; w = where(x > y, x, y)")
    async with ac.open_client("cuda:0") as gpu:
        tx, ty = gpu.create_array(x), gpu.create_array(y)
        s, c, m, w = kernel(gpu, x=tx, y=ty)
        np.testing.assert_array_equal(await gpu.read_array(s), np.maximum(x, y))
        np.testing.assert_array_equal(await gpu.read_array(c), x < y)
        np.testing.assert_array_equal(await gpu.read_array(m), x * y)
        np.testing.assert_array_equal(await gpu.read_array(w), np.where(x > y, x, y))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32"])
async def test_math_and_division_match_numpy_on_the_gpu(dtype: str) -> None:
    x = _data(dtype, 50_000)
    text = "y = exp(x / 8) + sqrt(abs(x)) + x // 3 + x % 3 + tanh(x)"
    with np.errstate(all="ignore"):
        want = np.exp(x / 8) + np.sqrt(np.abs(x)) + x // 3 + x % 3 + np.tanh(x)
    async with ac.open_client("cuda:0") as gpu:
        got = await gpu.read_array(ac.elementwise(text)(gpu, x=gpu.create_array(x)))
    assert got.dtype == want.dtype
    # float32: the GPU's expf/tanhf are a few ulp off numpy's, summed over five terms
    rtol = {"float16": 2e-3, "float32": 1e-4}.get(dtype, 1e-9)
    atol = {"float16": 1e-3, "float32": 1e-6}.get(dtype, 0)  # terms that cancel near 0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 65_537, 3_000_001])
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
async def test_reductions_of_every_size_on_the_gpu(n: int, op: str) -> None:
    if n == 0 and op in ("min", "max"):
        pytest.skip("no identity: refused on every server")
    x = _data("float64", n) if op != "prod" else np.full(n, 1.000001)
    async with ac.open_client("cuda:0") as gpu:
        got = await gpu.read_array(ac.reduction(op)(gpu, x=gpu.create_array(x)))
    np.testing.assert_allclose(got, getattr(np, op)(x), rtol=1e-9)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dtype", ["int32", "float32", "bool"])
async def test_axis_reductions_and_maps_on_the_gpu(axis: int, dtype: str) -> None:
    x = _data(dtype, 301 * 517).reshape(301, 517)
    async with ac.open_client("cuda:0") as gpu:
        tx = gpu.create_array(x)
        got = await gpu.read_array(ac.reduction("sum")(gpu, x=tx, axis=axis))
        biggest = await gpu.read_array(ac.reduction("max", "x * a")(gpu, x=tx, a=2, axis=axis))
    # float32 partial sums are added in another order than numpy's pairwise sum
    np.testing.assert_allclose(got, x.sum(axis=axis), rtol=1e-4 if dtype == "float32" else 0)
    np.testing.assert_array_equal(biggest, (x * 2).max(axis=axis))


async def test_a_graph_replays_kernels_written_once_on_the_gpu() -> None:
    x = np.arange(1000, dtype=np.float32)
    axpb, total = ac.elementwise("y = a * x + b"), ac.reduction("sum")
    async with ac.open_client("cuda:0") as gpu:
        tx, ty = gpu.create_array(x), gpu.empty_array((1000,), np.float32)
        out = gpu.empty_array((), np.float32)
        summed = total.bind(gpu, x=ty, out=out)
        axpb(gpu, x=tx, a=1.0, b=0.0, y=ty)  # compiled before the capture
        for launch in summed.launches:
            gpu.execute(*launch)
        await gpu.sync()
        async with gpu.capture() as graph:
            axpb(gpu, x=tx, a=3.0, b=1.0, y=ty)
            for launch in summed.launches:
                gpu.execute(*launch)
        graph.replay()
        np.testing.assert_allclose(await gpu.read_array(out), (3 * x + 1).sum(), rtol=1e-6)


async def test_back_to_back_reductions_share_their_streams_partials_on_the_gpu() -> None:
    """Calls on one stream reuse its partials buffer (issue 38), across kernels, sizes
    and accumulator widths, with no sync between them: each result is its own; tasks
    running at once each keep their own buffer."""
    sums = {dt: ac.reduction("sum") for dt in ("float64", "int32", "float32")}
    biggest = ac.reduction("max", "x * a")
    data = {dt: _data(dt, 3_000_001 - 7 * i) for i, dt in enumerate(sums)}
    async with ac.open_client("cuda:0") as gpu:
        tensors = {dt: gpu.create_array(x) for dt, x in data.items()}

        async def task(k: int) -> None:
            outs = []
            for _ in range(3):
                for dt, kernel in sums.items():
                    outs.append((dt, kernel(gpu, x=tensors[dt])))
                outs.append(("max", biggest(gpu, x=tensors["int32"], a=k + 1)))
            for dt, out in outs:
                got = await gpu.read_array(out)
                if dt == "max":
                    assert got == (data["int32"].astype(np.int64) * (k + 1)).max()
                else:  # another order than numpy's pairwise sum: up to rounding
                    x = data[dt].astype(np.float64)
                    bound = (1e-5 if dt == "float32" else 1e-12) * np.abs(x).sum()
                    np.testing.assert_allclose(got, x.sum(), rtol=0, atol=bound)

        await task(0)
        await asyncio.gather(*(task(k) for k in range(8)))
