"""Arguments that conflict, or that numpy would mangle, raise typed errors naming the
argument; numpy integers are accepted wherever ints are (issue 10, findings 4 and 7)."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, add_bindings

pytestmark = pytest.mark.asyncio


# -- finding 4: silent ignores ------------------------------------------------------------


async def test_read_array_refuses_a_dtype_or_shape_that_conflicts_with_the_tensor(
    host_client: ac.ComputeClient,
) -> None:
    t = host_client.create_array(np.arange(4, dtype=np.float32))
    with pytest.raises(ac.InvalidArgument, match="dtype=float64 conflicts"):
        await host_client.read_array(t, np.float64)
    with pytest.raises(ac.InvalidArgument, match=r"shape=\(2, 2\) conflicts"):
        await host_client.read_array(t, shape=(2, 2))
    same = await host_client.read_array(t, np.float32, shape=(4,))  # agreeing is fine
    np.testing.assert_array_equal(same, np.arange(4))


async def test_np_asarray_of_a_tensor_says_how_to_read_it(host_client: ac.ComputeClient) -> None:
    t = host_client.create_array(np.arange(4, dtype=np.float32))
    with pytest.raises(ac.InvalidArgument, match="read_array"):
        np.asarray(t)


async def test_an_empty_timeline_says_how_to_enable_recording(
    host_client: ac.ComputeClient, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="asynccube.profiling"):
        timeline = await host_client.timeline()
    assert len(timeline) == 0
    assert "ASYNCCUBE_PROFILING_LEVEL=medium" in timeline.hint
    assert "ASYNCCUBE_PROFILING_LEVEL=medium" in repr(timeline)
    assert any("profiling level" in r.getMessage() for r in caplog.records)


# -- finding 7: raw exceptions from inside --------------------------------------------------


async def test_read_array_of_a_size_not_a_multiple_of_the_dtype(
    host_client: ac.ComputeClient,
) -> None:
    h = host_client.create(b"12345")
    with pytest.raises(ac.InvalidArgument, match="5 bytes are not a whole number of dtype"):
        await host_client.read_array(h, np.float32)
    with pytest.raises(ac.InvalidArgument, match=r"shape=\(3,\)"):
        await host_client.read_array(h, np.uint8, shape=(3,))
    with pytest.raises(ac.InvalidArgument, match=r"dtype=.* is not a numpy dtype"):
        await host_client.read_array(h, "no such dtype")


async def test_pinned_refuses_what_is_not_a_stream() -> None:
    with pytest.raises(ac.InvalidArgument, match=r"StreamId\.pinned\(stream\)"):
        ac.StreamId.pinned("a").__enter__()  # type: ignore[arg-type]
    with ac.StreamId.pinned(np.int64(5)) as sid:  # type: ignore[arg-type]
        assert sid == ac.StreamId(5) and type(sid.value) is int


async def test_a_scalar_that_does_not_fit_its_float_dtype() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning from inside
        with pytest.raises(ac.ScalarTypeError, match="does not fit in float32"):
            ac.Bindings().with_scalar(np.float32, [1e40])
        with pytest.raises(ac.ScalarTypeError, match="does not fit in float16"):
            ac.Bindings().with_scalar(np.float16, [10**400])
    b = ac.Bindings().with_scalar(np.float32, [float("inf"), 3.0e38])  # explicit inf is kept
    assert np.isinf(b.scalars[np.dtype(np.float32)].values()[0])


async def test_object_arrays_are_refused_when_created(host_client: ac.ComputeClient) -> None:
    with pytest.raises(ac.InvalidArgument, match="dtype object"):
        host_client.create_array(np.array([1, "a"], dtype=object))
    with pytest.raises(ac.InvalidArgument, match="dtype object"):
        host_client.create(np.array([None], dtype=object))
    await host_client.sync()


async def test_read_without_a_list_names_the_argument(host_client: ac.ComputeClient) -> None:
    h = host_client.create(b"abcd")
    with pytest.raises(ac.InvalidArgument, match=r"read: bindings must be a list.*read\(\["):
        host_client.read(h)  # type: ignore[arg-type]
    with pytest.raises(ac.InvalidArgument, match="read_tensor: descriptors must be a list"):
        host_client.read_tensor(h.copy_descriptor((4,), (1,), 1))  # type: ignore[arg-type]
    assert await host_client.read([h]) == [b"abcd"]


async def test_numpy_integers_are_ordinary_ints(host_client: ac.ComputeClient) -> None:
    n = np.int64(16)
    a = host_client.create(np.ones(16, np.float32))
    out = host_client.empty(np.int64(4) * n)  # type: ignore[arg-type]
    count = ac.CubeCount(np.int32(1))  # type: ignore[arg-type]
    host_client.execute(ADD, count, add_bindings(a, a, out, n))  # type: ignore[arg-type]
    np.testing.assert_array_equal(await host_client.read_array(out, np.float32), 2.0)
    t = host_client.empty_array((np.int64(2), np.int64(3)), np.float32)
    assert t.shape == (2, 3) and all(type(d) is int for d in t.shape)
    (buf,) = await host_client.staging([np.int64(8)])  # type: ignore[list-item]
    assert buf.nbytes == 8
    bindings = ac.Bindings().with_scalar(np.uint32, [np.int64(7), np.uint8(1)])
    assert bindings.scalars[np.dtype(np.uint32)].values().tolist() == [7, 1]
