"""Bad input gets a clear, typed error, and the client keeps serving."""

from __future__ import annotations

import numpy as np
import pytest

import asynccube as ac

from .kernels import ADD, NOOP, blocks

pytestmark = pytest.mark.asyncio


async def _still_serves(client: ac.ComputeClient) -> None:
    h = client.create(b"ok")
    assert await client.read([h]) == [b"ok"]


async def test_foreign_handle_is_invalid(host_client: ac.ComputeClient) -> None:
    async with ac.open_client("host") as other:
        foreign = other.create(b"theirs")
        with pytest.raises(ac.InvalidHandle, match="another client"):
            await host_client.read([foreign])
    await _still_serves(host_client)


async def test_handle_of_closed_client_is_invalid(host_client: ac.ComputeClient) -> None:
    other = await ac.connect("host")
    stale = other.create(b"gone")
    await other.close()
    with pytest.raises(ac.InvalidHandle):
        await host_client.read([stale])
    await _still_serves(host_client)


async def test_freed_handle_is_invalid() -> None:
    client = await ac.connect("host")
    h = client.create(b"data")
    assert await client.read([h]) == [b"data"]
    await client.close()
    again = await ac.connect("host")
    with pytest.raises(ac.InvalidHandle):
        await again.read([h])
    await _still_serves(again)
    await again.close()


async def test_offsets_beyond_buffer(host_client: ac.ComputeClient) -> None:
    h = host_client.create(b"12345678")
    with pytest.raises(ac.InvalidArgument):
        h.with_offset_start(9)
    window = h.with_offset_start(4)
    with pytest.raises(ac.InvalidArgument, match="spans"):
        await host_client.read_tensor([window.copy_descriptor((8,), (1,), 1)])
    await _still_serves(host_client)


@pytest.mark.parametrize("size", [-1, -(2**40)])
async def test_negative_size_is_invalid(host_client: ac.ComputeClient, size: int) -> None:
    with pytest.raises(ac.InvalidArgument, match=f"size={size} must be >= 0"):
        host_client.empty(size)
    await _still_serves(host_client)


async def test_oversized_buffer_is_buffer_too_big(host_client: ac.ComputeClient) -> None:
    too_big = host_client.properties.max_allocation + 1
    with pytest.raises(ac.BufferTooBig, match="largest allocation"):
        host_client.empty(too_big)
    await _still_serves(host_client)


async def test_non_int_size(host_client: ac.ComputeClient) -> None:
    with pytest.raises(ac.InvalidArgument):
        host_client.empty(1.5)  # type: ignore[arg-type]
    await _still_serves(host_client)


async def test_kernel_without_host_part(host_client: ac.ComputeClient) -> None:
    cuda_only = ac.Kernel("cuda_only", cuda=ac.CudaSource("", entry="k"))
    host_client.execute(cuda_only, ac.CubeCount(1), ac.Bindings())
    with pytest.raises(ac.KernelNotSupported, match=r"cuda_only.*host"):
        await host_client.sync()
    await _still_serves(host_client)


async def test_wrong_scalar_dtype() -> None:
    with pytest.raises(ac.ScalarTypeError, match="declared float32"):
        ac.Bindings().with_scalar(np.float32, np.array([1], dtype=np.int64))
    with pytest.raises(ac.ScalarTypeError, match="not supported"):
        ac.Bindings().with_scalar(np.complex64, [1])
    with pytest.raises(ac.ScalarTypeError, match="does not fit"):
        ac.Bindings().with_scalar(np.uint8, [300])
    with pytest.raises(ac.ScalarTypeError, match="not an integer"):
        ac.Bindings().with_scalar(np.int32, [1.5])


async def test_missing_scalar_fails_the_kernel_not_the_client(
    host_client: ac.ComputeClient,
) -> None:
    a = host_client.create(np.zeros(4, np.float32))
    # ADD needs a uint32 scalar; give it a float32 one instead.
    bindings = ac.Bindings().with_buffers([a.binding()] * 3).with_scalar(np.float32, [4.0])
    host_client.execute(ADD, blocks(4), bindings)
    with pytest.raises(ac.ExecutionError, match="no uint32 scalars") as info:
        await host_client.sync()
    assert isinstance(info.value.__cause__, KeyError)
    await _still_serves(host_client)


async def test_bad_execute_arguments(host_client: ac.ComputeClient) -> None:
    with pytest.raises(ac.InvalidArgument, match="count must be a CubeCount"):
        host_client.execute(NOOP, (1, 1, 1), ac.Bindings())  # type: ignore[arg-type]
    with pytest.raises(ac.InvalidArgument, match="kernel must be a Kernel"):
        host_client.execute("noop", ac.CubeCount(1), ac.Bindings())  # type: ignore[arg-type]
    with pytest.raises(ac.InvalidArgument):
        ac.CubeCount(-1)
    await _still_serves(host_client)


async def test_bad_read_arguments(host_client: ac.ComputeClient) -> None:
    with pytest.raises(ac.InvalidArgument, match="Binding or Handle"):
        host_client.read([b"not a binding"])  # type: ignore[list-item]
    with pytest.raises(ac.InvalidArgument, match="CopyDescriptor"):
        host_client.read_tensor([object()])  # type: ignore[list-item]
    await _still_serves(host_client)


async def test_write_with_wrong_length(host_client: ac.ComputeClient) -> None:
    h = host_client.empty(16)
    host_client.write([(h.copy_descriptor((4,), (1,), 4), b"short")])
    with pytest.raises(ac.InvalidArgument, match="5 bytes"):
        await host_client.sync()
    await _still_serves(host_client)


async def test_unknown_profile_token(host_client: ac.ComputeClient) -> None:
    with pytest.raises(ac.ProfileError):
        await host_client.end_profile(ac.ProfilingToken(12345))
    token = host_client.start_profile()
    await host_client.end_profile(token)
    with pytest.raises(ac.ProfileError, match="already ended"):
        await host_client.end_profile(token)
    await _still_serves(host_client)


async def test_every_call_after_close_raises(host_client: ac.ComputeClient) -> None:
    h = host_client.create(b"x")
    await host_client.close()
    await host_client.close()  # idempotent
    calls = [
        lambda: host_client.create(b"x"),
        lambda: host_client.empty(1),
        lambda: host_client.read([h]),
        lambda: host_client.sync(),
        lambda: host_client.execute(NOOP, ac.CubeCount(1), ac.Bindings()),
        lambda: host_client.flush(),
        lambda: host_client.memory_usage(),
        lambda: host_client.memory_cleanup(),
        lambda: host_client.start_profile(),
        lambda: host_client.write([]),
        lambda: host_client.get_resource(h),
    ]
    for call in calls:
        with pytest.raises(ac.ClientClosedError):
            call()


async def test_errors_share_one_base() -> None:
    for cls in (
        ac.BufferTooBig,
        ac.UnsupportedStrides,
        ac.InvalidHandle,
        ac.Unknown,
        ac.UnsupportedIoOperation,
        ac.ProfileError,
        ac.ClientClosedError,
        ac.LoopMismatchError,
    ):
        assert issubclass(cls, ac.AsyncCubeError)
    for cls in (ac.BufferTooBig, ac.UnsupportedStrides, ac.InvalidHandle, ac.Unknown):
        assert issubclass(cls, ac.IoError)


async def test_negative_strides_unsupported(host_client: ac.ComputeClient) -> None:
    h = host_client.empty(16)
    with pytest.raises(ac.UnsupportedStrides):
        await host_client.read_tensor([h.copy_descriptor((4,), (-1,), 4)])
    await _still_serves(host_client)


async def test_public_errors_are_named_and_pickled_as_asynccube_x() -> None:
    """Issue 37, point 18: tracebacks say ``asynccube.LoopMismatchError``, not the
    private module; every public error still pickles (those with other arguments too)."""
    import pickle
    import traceback

    from asynccube._core import errors

    public = [getattr(ac, name) for name in errors.__all__ if hasattr(ac, name)]
    assert len(public) >= 30
    for cls in public:
        assert cls.__module__ == "asynccube", cls
        made = {
            ac.BufferTooBig: lambda: ac.BufferTooBig(16, "too big"),
            ac.OutOfMemory: lambda: ac.OutOfMemory(16, 32, "pool 0"),
            ac.MemoryLayoutError: lambda: ac.MemoryLayoutError("bad", pool=2),
            ac.MemoryInUse: lambda: ac.MemoryInUse(3),
            ac.CompilationError: lambda: ac.CompilationError("failed", "log"),
            ac.AutotuneCheckError: lambda: ac.AutotuneCheckError("report"),
        }.get(cls, lambda c=cls: c("what went wrong"))()  # type: ignore[misc]
        made.add_note("a note")
        back = pickle.loads(pickle.dumps(made))
        assert type(back) is cls and str(back) == str(made) and back.__notes__ == ["a note"]
        assert back.__dict__ == made.__dict__
    try:
        raise ac.LoopMismatchError("elsewhere")
    except ac.LoopMismatchError as exc:
        text = "".join(traceback.format_exception(exc))
    assert "asynccube.LoopMismatchError: elsewhere" in text and "_core" not in text.split("\n")[-2]
