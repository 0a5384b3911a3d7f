"""Arguments that conflict, or that numpy would mangle, raise typed errors naming the
argument; numpy integers are accepted wherever ints are (issue 10, findings 4 and 7)."""

from __future__ import annotations

import logging
import os
import re
import warnings
from typing import Any

import numpy as np
import pytest

import asynccube as ac
from asynccube._core.cli import demo

from .kernels import ADD, add_bindings
from .tune_helpers import SizeKey, size_key

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
    with pytest.raises(ac.InvalidArgument, match="create_array: dtype=object"):
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


# -- issue 28, point 5: every bad input a typed error naming the argument ------------------


async def test_empty_array_refuses_what_is_not_plain_fixed_size_data(
    client: ac.ComputeClient,
) -> None:
    with pytest.raises(ac.InvalidArgument, match=r"empty_array: dtype='nonsense' is not a numpy"):
        client.empty_array((4,), "nonsense")
    for dtype in (object, np.dtype([("a", np.int32), ("b", object)]), "U"):
        with pytest.raises(ac.InvalidArgument, match=r"empty_array: dtype=.* not plain fixed-size"):
            client.empty_array((4,), dtype)
    for dtype in ("U3", "S8", "V8", np.dtype([("a", np.int32)]), "datetime64[s]"):
        with pytest.raises(
            ac.InvalidArgument, match=r"empty_array: dtype=.* not a numeric or bool"
        ):
            client.empty_array((4,), dtype)
    t = client.empty_array((4,), np.bool_)  # plain data is fine
    assert t.dtype == np.bool_ and t.nbytes_spanned() == 4
    del t
    await client.sync()


async def test_malformed_sizes_are_invalid_arguments_not_too_big(
    client: ac.ComputeClient,
) -> None:
    for call, match in (
        (lambda: client.empty(-1), r"size=-1 must be >= 0"),
        (lambda: client.empty(3.5), r"size=3\.5 must be an int"),
        (lambda: client.empty_array((3.5,), np.float32), r"shape=\(3\.5,\) must hold ints"),
        (lambda: client.empty_array((2, -1), np.float32), r"shape=\(2, -1\) must hold ints"),
        (lambda: client.empty_array(None, np.float32), r"empty_array: shape=None"),
        (lambda: client.empty_tensors([(3.5,)], [4]), r"shape=\(3\.5,\) must hold ints"),
    ):
        with pytest.raises(ac.InvalidArgument, match=match) as info:
            call()
        assert not isinstance(info.value, ac.BufferTooBig)
    assert await client.read([client.create(b"ok")]) == [b"ok"]  # still serving


async def test_an_allocation_above_the_limit_is_refused_at_the_call(
    client: ac.ComputeClient,
) -> None:
    limit = client.properties.max_allocation
    with pytest.raises(ac.BufferTooBig, match=f"largest allocation on .* is {limit} bytes"):
        client.empty(limit + 1)
    with pytest.raises(ac.BufferTooBig, match="allocate less"):
        client.empty_array((limit // 4 + 1,), np.float32)
    await client.sync()  # nothing was queued, nothing failed later


async def test_bindings_builders_refuse_what_is_not_a_list_of_buffers(
    client: ac.ComputeClient,
) -> None:
    h = client.empty(16)
    b = ac.Bindings()
    bad: list[tuple[Any, object, str]] = [
        (b.with_buffers, None, r"with_buffers: bindings must be a list, got NoneType"),
        (b.with_buffers, h, r"with_buffers: bindings must be a list, got Handle"),
        (b.with_buffers, [h, "x"], r"with_buffers: bindings\[1\] must be a Handle"),
        (b.with_buffers, [h.binding(), "x"], r"with_buffers: bindings\[1\] must be a Handle"),
        (b.with_buffer, None, r"with_buffer: binding must be a Handle or Binding"),
        (b.with_scalars, None, r"with_scalars: bindings must be a list"),
        (b.with_scalars, [1.0], r"with_scalars: bindings must hold ScalarBindings"),
        (b.with_metadata, [1, 2], r"with_metadata: meta must be a MetadataBinding"),
        (b.with_tensor_maps, None, r"with_tensor_maps: bindings must be a list"),
    ]
    for method, value, match in bad:
        with pytest.raises(ac.InvalidArgument, match=match):
            method(value)
    assert b.buffers == []  # nothing half-added
    assert len(ac.Bindings().with_buffers((h, h.binding())).buffers) == 2  # a tuple is fine
    await client.sync()


async def test_write_shows_its_one_form(client: ac.ComputeClient) -> None:
    h = client.empty(16)
    data = np.arange(4, dtype=np.float32)
    desc = h.copy_descriptor((4,), (1,), 4)
    form = r"client\.write\(\[\(handle\.copy_descriptor\(shape, strides, elem_size\), data\)"
    for call, match in (
        (lambda: client.write(h, data), r"write: takes one argument.*given 2 \(Handle, ndarray\)"),  # type: ignore[call-arg, arg-type]
        (lambda: client.write([desc]), r"write: items\[0\] must be a \(descriptor, data\) pair"),  # type: ignore[list-item]
        (lambda: client.write((desc, data)), r"write: items\[0\] must be a \(descriptor, data\)"),  # type: ignore[arg-type]
        (lambda: client.write(desc), r"write: items must be a list of \(descriptor, data\) pairs"),  # type: ignore[arg-type]
        (lambda: client.write([(desc, data, 1)]), r"write: items\[0\] must be a \(descriptor"),  # type: ignore[list-item]
    ):  # fmt: skip
        with pytest.raises(ac.InvalidArgument, match=match) as info:
            call()
        assert re.search(form, str(info.value))
    with pytest.raises(ac.InvalidArgument, match=r"items\[0\]\[0\] is a Handle.*handle\.size"):
        client.write([(h, data)])  # type: ignore[list-item]
    client.write([(desc, data)])  # the form shown works
    np.testing.assert_array_equal(await client.read_array(h, np.float32), data)


@pytest.mark.parametrize(
    ("shape", "strides"), [(4, (1,)), ((4,), None), (None, (1,)), (1.5, 1)], ids=str
)
async def test_copy_descriptor_refuses_a_shape_that_is_not_a_sequence(
    host_client: ac.ComputeClient, shape: Any, strides: Any
) -> None:
    h = host_client.empty(16)
    with pytest.raises(ac.InvalidArgument, match=r"copy_descriptor: shape and strides must"):
        h.copy_descriptor(shape, strides, 4)
    desc = h.copy_descriptor([4], [1], 4)  # any sequence of ints
    assert (desc.shape, desc.strides) == ((4,), (1,))
    host_client.write([(desc, np.ones(4, np.float32))])
    np.testing.assert_array_equal(await host_client.read_array(h, np.float32), np.ones(4))


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"block": 256}, "block must be three positive ints"),
        ({"block": (16, 16)}, "block must be three positive ints"),
        ({"block": (1.5, 1, 1)}, "block must be three positive ints"),
        ({"block": (True, 1, 1)}, "block must be three positive ints"),
        ({"options": "-O3"}, "options must be NVRTC options"),
        ({"shared_mem_bytes": 1.5}, "shared_mem_bytes must be an int >= 0"),
        ({"entry": None}, r"CudaSource\(source, entry\).*str and NoneType"),
    ],
)
async def test_cuda_source_refuses_what_it_cannot_launch(kwargs: Any, words: str) -> None:
    args: dict[str, Any] = {"source": 'extern "C" __global__ void f() {}', "entry": "f"}
    with pytest.raises(ac.InvalidArgument, match=words):
        ac.CudaSource(**{**args, **kwargs})
    made = ac.CudaSource(**args, block=[np.int64(8), 2, 1], options=["-O3"])  # type: ignore[arg-type]
    assert made.block == (8, 2, 1) and made.options == ("-O3",)
    assert hash(made) == hash(ac.CudaSource(**args, block=(8, 2, 1), options=("-O3",)))


@pytest.mark.parametrize("op", [["sum"], None, 3])
async def test_a_reduction_op_that_is_not_a_name_is_a_definition_error(op: Any) -> None:
    with pytest.raises(ac.KernelDefinitionError, match="reduction op must be one of"):
        ac.reduction(op)


async def test_a_tunable_that_is_not_async_is_named(client: ac.ComputeClient) -> None:
    def plain(c: ac.ComputeClient, n: int) -> int:
        return n

    tunables: ac.TunableSet[SizeKey, int, int] = ac.TunableSet(size_key, tunables=[plain])  # type: ignore[list-item]
    with pytest.raises(ac.InvalidArgument, match=r"tunable 'plain': fn returned int, not an"):
        await tunables[0](client, 4)
    with pytest.raises(ac.InvalidArgument, match="async def plain"):
        await ac.Tuner("issue28_plain").execute(client, tunables, 4)
    await client.sync()


async def test_a_default_that_names_no_tunable_is_refused() -> None:
    async def one(c: ac.ComputeClient, n: int) -> int:
        return n

    with pytest.raises(ac.InvalidArgument, match=r"default='zzz' is not one of its tunables"):
        ac.TunableSet(size_key, default="zzz", tunables=[one])
    with pytest.raises(ac.InvalidArgument, match=r"default=3 is not one of its tunables"):
        ac.TunableSet(size_key, default=3, tunables=[one])
    with pytest.raises(ac.InvalidArgument, match=r"default must be an index or a tunable's name"):
        ac.TunableSet(size_key, default=None)  # type: ignore[arg-type]
    assert ac.TunableSet(size_key, default="one", tunables=[one]).default_index == 0


@pytest.mark.parametrize("device", ["host:1", "host:7", "HOST:2", "gpu", ""])
async def test_a_device_string_that_names_no_device_is_refused(device: str) -> None:
    with pytest.raises(ac.InvalidArgument, match=f"unknown device {device!r}.*use 'host'"):
        async with ac.open_client(device):
            pass  # pragma: no cover - must not open
    async with ac.open_client("host:0") as c:  # the one host device, by index
        assert c.device == "host"


@pytest.mark.parametrize("stream", [-1, 2**63, 2**80, ac.StreamId(-3), np.int64(-2)])
async def test_pinned_refuses_an_id_out_of_range(stream: object) -> None:
    with pytest.raises(ac.InvalidArgument, match=r"stream must be in \[0, 2\*\*63 - 1\]"):
        ac.StreamId.pinned(stream).__enter__()  # type: ignore[arg-type]
    with ac.StreamId.pinned(2**63 - 1) as sid:
        assert sid.value == 2**63 - 1


# -- the host limit: the machine's memory, or [memory] host_limit_bytes --------------------


async def test_the_host_limit_is_the_machines_memory() -> None:
    memory = physical_memory()
    async with ac.open_client("host") as c:
        assert c.properties.max_allocation == min(memory, 2**40)
        if memory < 2**40:
            with pytest.raises(ac.BufferTooBig, match=r"physical memory.*host_limit_bytes"):
                c.empty(2**40)  # refused at the call, not in another task later
        await c.sync()


async def test_the_host_limit_is_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    async with ac.open_client("host", config={"memory": {"host_limit_bytes": 1 << 20}}) as c:
        assert c.properties.max_allocation == 1 << 20
        with pytest.raises(ac.BufferTooBig, match=r"is 1048576 bytes \(1\.0 MiB\)"):
            c.empty((1 << 20) + 1)
        h = c.empty(1 << 20)  # the limit itself is fine
        del h
        await c.sync()
    monkeypatch.setenv("ASYNCCUBE_MEMORY_HOST_LIMIT_BYTES", "4096")
    async with ac.open_client("host") as c:
        assert c.properties.max_allocation == 4096
    monkeypatch.setenv("ASYNCCUBE_MEMORY_HOST_LIMIT_BYTES", "-1")
    with pytest.raises(ac.ConfigError, match="ASYNCCUBE_MEMORY_HOST_LIMIT_BYTES"):
        await ac.connect("host")
    assert ac.HostServer().properties.max_allocation == min(physical_memory(), 2**40)


def physical_memory() -> int:
    """The machine's physical memory, as the host server reads it (Linux, macOS)."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


async def test_demo_arguments_are_bounded() -> None:
    for args, match in (
        ((100_000_000, 10, 1), r"tasks must be at most 100,000, got 100,000,000"),
        ((1, 10_000_000_000, 1), r"elements must be at most 268,435,456"),
        ((1, 10, 10**9), r"rounds must be at most 10,000"),
        ((100_000, 1, 10_000), r"1,000,000,000 launches"),
        ((100_000, 1 << 28, 1), r"needs about .* of memory at once"),
    ):
        with pytest.raises(ac.InvalidArgument, match=match):
            demo.check_demo_args(*args)
