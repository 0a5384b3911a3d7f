"""Kernels written once (issue 26, part 1) on the host server: ``ac.elementwise`` and
``ac.reduction`` compute what numpy computes, in numpy's dtypes; bad input is a typed
error naming it, and the client keeps serving."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

import asynccube as ac

pytestmark = pytest.mark.asyncio

AXPB = ac.elementwise("y = a * x + b", name="axpb")
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
DTYPES += ["float16", "float32", "float64"]


def _data(dtype: str, n: int, seed: int = 0) -> np.ndarray[Any, Any]:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(n) > 0.5
    if np.dtype(dtype).kind == "f":
        return (rng.standard_normal(n) * 4).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -50), min(info.max, 50), n, endpoint=True).astype(dtype)


def _same(got: np.ndarray[Any, Any], want: Any) -> None:
    want = np.asarray(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


async def test_axpb_returns_a_tensor_of_numpys_result(host_client: ac.ComputeClient) -> None:
    x = np.arange(100_000, dtype=np.float32)
    y = AXPB(host_client, x=host_client.create_array(x), a=2.0, b=1.0)
    assert isinstance(y, ac.Tensor)
    _same(await host_client.read_array(y), 2.0 * x + 1.0)


async def test_a_given_output_is_written_in_its_dtype(host_client: ac.ComputeClient) -> None:
    x = np.arange(10, dtype=np.int32)
    out = host_client.empty_array((10,), np.float64)
    assert AXPB(host_client, x=host_client.create_array(x), a=3, b=1, y=out) is out
    _same(await host_client.read_array(out), (3 * x + 1).astype(np.float64))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_arithmetic_and_comparisons_in_every_dtype(
    host_client: ac.ComputeClient, dtype: str
) -> None:
    a, b = _data(dtype, 70_000, 1), _data(dtype, 70_000, 2)
    ta, tb = host_client.create_array(a), host_client.create_array(b)
    kernel = ac.elementwise("s = maximum(a, b); c = a < b; w = where(a > b, a, b); m = a * b")
    s, c, w, m = kernel(host_client, a=ta, b=tb)
    _same(await host_client.read_array(s), np.maximum(a, b))
    _same(await host_client.read_array(c), a < b)
    _same(await host_client.read_array(w), np.where(a > b, a, b))
    _same(await host_client.read_array(m), a * b)


EXPRESSIONS = [
    ("y = exp(x) + sqrt(abs(x))", lambda x: np.exp(x) + np.sqrt(np.abs(x))),
    ("y = tanh(x) * 2.5 - log1p(abs(x))", lambda x: np.tanh(x) * 2.5 - np.log1p(np.abs(x))),
    ("y = x // 3 + x % 3", lambda x: x // 3 + x % 3),
    ("y = floor(x) + ceil(x) - trunc(x)", lambda x: np.floor(x) + np.ceil(x) - np.trunc(x)),
    ("y = x ** 2 + pow(abs(x), 0.5)", lambda x: x**2 + np.power(np.abs(x), 0.5)),
    ("y = x if x > 0 else -x", lambda x: np.where(x > 0, x, -x)),
    ("y = int32(x) * 2 + float32(x)", lambda x: x.astype(np.int32) * 2 + x.astype(np.float32)),
    ("y = (x > -1) and not (x > 1)", lambda x: np.logical_and(x > -1, ~(x > 1))),
    ("y = -1 < x < 1", lambda x: (x > -1) & (x < 1)),
    (
        "y = minimum(x, 0.5) + sign(x) + square(x)",
        lambda x: np.minimum(x, 0.5) + np.sign(x) + x * x,
    ),
    ("y = x / 7", lambda x: x / 7),
]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize(("text", "numpy_fn"), EXPRESSIONS, ids=[e[0] for e in EXPRESSIONS])
async def test_expressions_match_numpy(
    host_client: ac.ComputeClient, dtype: str, text: str, numpy_fn: Any
) -> None:
    x = _data(dtype, 40_000)

    def expected() -> Any:
        with np.errstate(all="ignore"):
            return numpy_fn(x)

    want = await asyncio.to_thread(expected)  # float16 // and % take ms: not on the loop
    y = ac.elementwise(text)(host_client, x=host_client.create_array(x))
    got = await host_client.read_array(y)
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype != "float16" else 1e-3)


async def test_python_scalars_are_weak_numpy_scalars_strong(host_client: ac.ComputeClient) -> None:
    x = host_client.create_array(np.ones(5, np.float32))
    assert AXPB(host_client, x=x, a=2.0, b=1).dtype == np.float32
    assert AXPB(host_client, x=x, a=np.float64(2.0), b=1).dtype == np.float64
    xi = host_client.create_array(np.ones(5, np.int16))
    assert AXPB(host_client, x=xi, a=2, b=1).dtype == np.int16
    assert AXPB(host_client, x=xi, a=2.0, b=1).dtype == np.float64
    masked = ac.elementwise("y = where(m, x, 0.0)")(host_client, x=x, m=True)
    _same(await host_client.read_array(masked), np.ones(5, np.float32))


async def test_in_place_and_later_statements_read_outputs(host_client: ac.ComputeClient) -> None:
    x = np.arange(8, dtype=np.float32)
    tx = host_client.create_array(x)
    kernel = ac.elementwise("x = x * 2; z = x + 1")
    (tx2, z) = kernel(host_client, x=tx)
    assert tx2 is tx
    _same(await host_client.read_array(tx), x * 2)
    _same(await host_client.read_array(z), x * 2 + 1)


@pytest.mark.parametrize("n", [0, 1, 255, 32768, 32769, 100_003])
async def test_every_size_including_empty(host_client: ac.ComputeClient, n: int) -> None:
    x = _data("float64", n)
    tx = host_client.create_array(x)
    _same(await host_client.read_array(AXPB(host_client, x=tx, a=2.0, b=1.0)), 2.0 * x + 1.0)
    total = ac.reduction("sum")(host_client, x=tx)
    np.testing.assert_allclose(await host_client.read_array(total), x.sum())


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", DTYPES)
async def test_reductions_whole_and_per_axis(
    host_client: ac.ComputeClient, op: str, dtype: str
) -> None:
    x = _data(dtype, 3 * 41, 3).reshape(3, 41)
    if op == "prod" and x.dtype.kind == "f":
        x = (x / 8 + 1).astype(dtype)
    tx = host_client.create_array(x)
    kernel = ac.reduction(op)
    fn = getattr(np, op)
    rtol = 1e-2 if dtype == "float16" else 1e-5
    for axis in (None, 0, 1, -1):
        got = await host_client.read_array(kernel(host_client, x=tx, axis=axis))
        want = np.asarray(fn(x, axis=axis))
        assert got.dtype == want.dtype, (axis, got.dtype, want.dtype)
        assert got.shape == want.shape
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol)


async def test_map_then_reduce_with_scalars(host_client: ac.ComputeClient) -> None:
    x, y = _data("float32", 50_000, 4), _data("float32", 50_000, 5)
    tx, ty = host_client.create_array(x), host_client.create_array(y)
    dot = ac.reduction("sum", "x * y * a")
    got = await host_client.read_array(dot(host_client, x=tx, y=ty, a=0.5))
    np.testing.assert_allclose(got, np.sum(x * y * 0.5), rtol=1e-4)
    rows = ac.reduction("max", "abs(x - y)")
    x2, y2 = tx, ty
    got2 = await host_client.read_array(
        rows(
            host_client,
            x=host_client.tensor(x2.handle, (500, 100), np.float32),
            y=host_client.tensor(y2.handle, (500, 100), np.float32),
            axis=1,
        )
    )
    np.testing.assert_array_equal(got2, np.abs(x - y).reshape(500, 100).max(axis=1))


async def test_a_float16_sum_accumulates_in_float32(host_client: ac.ComputeClient) -> None:
    x = np.full(10_000, 0.1, np.float16)
    got = await host_client.read_array(
        ac.reduction("sum")(host_client, x=host_client.create_array(x))
    )
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, np.sum(x), rtol=1e-3)


async def test_launches_through_execute_and_in_a_graph(host_client: ac.ComputeClient) -> None:
    x = np.arange(1000, dtype=np.float32)
    tx, ty = host_client.create_array(x), host_client.empty_array((1000,), np.float32)
    total = host_client.empty_array((), np.float32)
    call = AXPB.bind(host_client, x=tx, a=2.0, b=1.0, y=ty)
    for launch in call.launches:
        host_client.execute(*launch)
    _same(await host_client.read_array(ty), 2 * x + 1)
    summed = ac.reduction("sum").bind(host_client, x=ty, out=total)
    async with host_client.capture() as graph:
        AXPB(host_client, x=tx, a=3.0, b=0.0, y=ty)
        for launch in summed.launches:
            host_client.execute(*launch)
    _same(await host_client.read_array(ty), 2 * x + 1)  # captured, not run
    graph.replay()
    _same(await host_client.read_array(ty), 3 * x)
    np.testing.assert_allclose(await host_client.read_array(total), (3 * x).sum())


async def test_kernels_are_made_once_per_dtype_signature(host_client: ac.ComputeClient) -> None:
    kernel = ac.elementwise("y = x + 1")
    for dtype in ("float32", "float32", "int64", "float32"):
        kernel(host_client, x=host_client.create_array(np.ones(3, dtype)))
    assert len(kernel._specs) == 2
    ids = {spec.kernel.id for spec in kernel._specs.values()}
    assert len(ids) == 2 and all(i.startswith("elementwise_") for i in ids)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("y = foo(x)", "unknown function 'foo'"),
        ("y = x +", "not a valid expression"),
        ("y = x @ x", "operator MatMult"),
        ("y = x[0]", "Subscript"),
        ("y = x; y = 2 * x", "assigned twice"),
        ("x + 1", "only assignments"),
        ("y = exp(x, x)", "takes 1 positional"),
        ("y = 'a'", "str literal"),
    ],
)
async def test_bad_definitions_name_the_problem(text: str, said: str) -> None:
    with pytest.raises(ac.KernelDefinitionError, match=said):
        ac.elementwise(text)


async def test_bad_reductions_are_refused_at_definition() -> None:
    with pytest.raises(ac.KernelDefinitionError, match="one of"):
        ac.reduction("mean")
    with pytest.raises(ac.KernelDefinitionError, match="'axis'"):
        ac.reduction("sum", "x * axis")


async def test_bad_calls_are_typed_errors_and_the_client_keeps_serving(
    host_client: ac.ComputeClient,
) -> None:
    f32 = host_client.create_array(np.ones(4, np.float32))
    other = host_client.create_array(np.ones(5, np.float32))
    flags = host_client.create_array(np.ones(4, bool))
    cases: list[tuple[type[Exception], str, Any]] = [
        (
            ac.InvalidArgument,
            r"missing argument\(s\) \['b'\]",
            lambda: AXPB(host_client, x=f32, a=1.0),
        ),
        (
            ac.InvalidArgument,
            r"unknown argument\(s\) \['c'\]",
            lambda: AXPB(host_client, x=f32, a=1, b=1, c=2),
        ),
        (ac.InvalidArgument, "one shape", lambda: AXPB(host_client, x=f32, a=other, b=1.0)),
        (
            ac.InvalidArgument,
            r"one shape, got x \(4,\), y \(5,\)",
            lambda: AXPB(host_client, x=f32, a=1, b=1, y=other),
        ),
        (ac.InvalidArgument, "numpy array", lambda: AXPB(host_client, x=np.ones(4), a=1, b=1)),
        (
            ac.KernelDefinitionError,
            "no negative for \\(bool\\)",
            lambda: ac.elementwise("y = -x")(host_client, x=flags),
        ),
        (
            ac.KernelDefinitionError,
            "no invert",
            lambda: ac.elementwise("y = ~x")(host_client, x=f32),
        ),
        (
            ac.KernelDefinitionError,
            "out of bounds for int8",
            lambda: ac.elementwise("y = x + a")(
                host_client, x=host_client.create_array(np.ones(2, np.int8)), a=1000
            ),
        ),
        (ac.InvalidArgument, "axis=2", lambda: ac.reduction("sum")(host_client, x=f32, axis=2)),
        (
            ac.InvalidArgument,
            "no identity",
            lambda: ac.reduction("min")(
                host_client, x=host_client.create_array(np.ones(0, np.float32))
            ),
        ),
        (
            ac.InvalidArgument,
            "dtype complex64",
            lambda: AXPB(
                host_client, x=host_client.create_array(np.ones(4, np.complex64)), a=1, b=1
            ),
        ),
    ]
    for error, said, call in cases:
        with pytest.raises(error, match=said):
            call()
    y = AXPB(host_client, x=f32, a=2.0, b=1.0)  # still serving
    _same(await host_client.read_array(y), np.full(4, 3, np.float32))


async def test_a_tensor_of_another_client_is_refused(host_client: ac.ComputeClient) -> None:
    async with ac.open_client("host") as other:
        foreign = other.create_array(np.ones(3, np.float32))
        with pytest.raises(ac.InvalidArgument, match="not made by this client"):
            AXPB(host_client, x=foreign, a=1.0, b=1.0)
