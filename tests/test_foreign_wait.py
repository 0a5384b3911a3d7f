"""``client.wait(obj)`` / ``client.after(obj)`` without a GPU: what each object is taken
for (fakes of torch's, CuPy's and cuda.core's types), the host server's refusal by name,
bad input, and the channel's half (ordering, held errors, cancellation under asyncio and
trio) through a deliberately slow fake server that accepts foreign work. The GPU's half
is in ``test_foreign_cuda.py``."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import pytest

import asynccube as ac
from asynccube._core.channel.backend import current_backend
from asynccube._core.client.foreign import describe
from asynccube._core.host.worker import HostCompletion
from asynccube._core.server.foreign import ForeignWork

from .kernels import NOOP
from .tasks import in_task

pytestmark = pytest.mark.anyio  # each backend: asyncio and trio


class ProtocolStream:
    """cuda.core's protocol, as a method."""

    def __init__(self, handle: int = 0x5A00, version: int = 0) -> None:
        self.value = (version, handle)

    def __cuda_stream__(self) -> Any:
        return self.value


class PropertyStream:
    """The protocol as an attribute (cuda.core's first versions)."""

    __cuda_stream__ = (0, 0x77)


class RaisingStream:
    def __cuda_stream__(self) -> Any:
        raise RuntimeError("no stream here")


class _Device:
    def __init__(self, kind: str, index: int | None) -> None:
        self.type, self.index = kind, index


class TorchStream:
    __module__ = "torch.cuda.streams"

    def __init__(self, handle: int, kind: str = "cuda", index: int | None = 0) -> None:
        self.cuda_stream = handle
        self.device = _Device(kind, index)


class TorchEvent:
    __module__ = "torch.cuda.streams"

    def __init__(self, handle: int, index: int | None = 0) -> None:
        self.cuda_event = handle
        self.device = None if index is None else _Device("cuda", index)


class Stream:
    __module__ = "cupy.cuda.stream"

    def __init__(self, ptr: int, device_id: int = 0) -> None:
        self.ptr, self.device_id = ptr, device_id


class Event:
    __module__ = "cupy.cuda.stream"

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


# -- what an object is taken for ---------------------------------------------------------


@pytest.mark.parametrize(
    ("obj", "kind", "handle", "device"),
    [
        (ProtocolStream(0x5A00), "stream", 0x5A00, None),
        (PropertyStream(), "stream", 0x77, None),
        (TorchStream(0x1234, index=1), "stream", 0x1234, 1),
        (TorchStream(0), "stream", 0, 0),  # torch's default stream is the NULL stream
        (TorchEvent(0xE1), "event", 0xE1, 0),
        (TorchEvent(0, index=None), "event", 0, None),  # never recorded
        (Stream(0x99, device_id=2), "stream", 0x99, 2),
        (Stream(0x1, device_id=-1), "stream", 0x1, None),  # CuPy's singletons: -1
        (Event(0xE2), "event", 0xE2, None),
        (0, "stream", 0, None),
        ((1 << 64) - 1, "stream", (1 << 64) - 1, None),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, (str, int)) else str(v),
)
def test_describe(obj: Any, kind: str, handle: int, device: int | None) -> None:
    work = describe(obj, "wait")
    assert (work.kind, work.handle, work.device) == (kind, handle, device)
    assert work.where().startswith("client.wait(")


class DeclaredTorchStream:
    """As torch.cuda.Stream: its class declares ``cuda_stream`` (a property); asking an
    object for anything else fails loudly."""

    __module__ = "torch.cuda.streams"
    cuda_stream = property(lambda self: 0x4321)

    def __init__(self) -> None:
        self.device = _Device("cuda", 0)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"describe asked the object for {name}")


def test_describe_reads_what_a_torch_class_declares() -> None:
    """A torch type whose class declares its handle is read by it alone: no lookup of
    the other kind's attribute, which fails (an exception raised and caught) on every
    ``client.wait(torch_stream)``."""
    for _ in range(2):  # the class's answer is kept after the first
        work = describe(DeclaredTorchStream(), "wait")
        assert (work.kind, work.handle, work.device) == ("stream", 0x4321, 0)


class DeclaredOdd:
    """A torch stream class that declares ``cuda_stream``, with what an object may carry."""

    __module__ = "torch.cuda.streams"
    cuda_stream = property(lambda self: self.raw)

    def __init__(self, raw: Any, kind: str = "cuda", index: Any = 0) -> None:
        self.raw, self.device = raw, _Device(kind, index)


@pytest.mark.parametrize(
    ("obj", "outcome"),
    [
        (DeclaredOdd(0x55, index=None), ("stream", 0x55, None)),
        (DeclaredOdd(0x55, index="3"), ("stream", 0x55, None)),
        (DeclaredOdd(0x55, kind="xpu"), r"it is a xpu stream, not a CUDA one"),
        (DeclaredOdd(-1), r"an int in \[0, 2\*\*64\), got -1"),
        (DeclaredOdd(1 << 64), r"an int in \[0, 2\*\*64\)"),
        (DeclaredOdd(True), r"an int in \[0, 2\*\*64\), got True"),
    ],
    ids=repr,
)
def test_describe_declared_torch_streams_checked_in_one_frame(obj: Any, outcome: Any) -> None:
    """The one-frame branch for a class declaring ``cuda_stream`` takes a good handle of a
    CUDA device and leaves anything else to the checks that name it."""
    if isinstance(outcome, tuple):
        work = describe(obj, "wait")
        assert (work.kind, work.handle, work.device) == outcome
        return
    with pytest.raises(ac.ForeignStreamError, match=outcome):
        describe(obj, "wait")


def test_describe_cuda_bindings_handles() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    stream, event = describe(driver.CUstream(0x42), "after"), describe(driver.CUevent(7), "wait")
    assert (stream.kind, stream.handle) == ("stream", 0x42)
    assert (event.kind, event.handle) == ("event", 7)


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ("stream", r"takes a CUDA stream or event.*got builtins\.str"),
        (True, r"takes a CUDA stream or event.*got builtins\.bool"),
        (1.5, r"got builtins\.float"),
        (None, r"got builtins\.NoneType"),
        (-1, r"an int in \[0, 2\*\*64\), got -1"),
        (1 << 64, r"an int in \[0, 2\*\*64\)"),
        (ProtocolStream(version=1), r"must return \(0, handle\).*returned \(1, "),
        (ProtocolStream(handle=-3), r"must return \(0, handle\)|in \[0, 2\*\*64\)"),
        (RaisingStream(), r"__cuda_stream__\(\) raised RuntimeError"),
        (TorchStream(0x10, kind="xpu"), r"it is a xpu stream, not a CUDA one"),
        (Stream("not an int"), r"an int in \[0, 2\*\*64\)"),  # type: ignore[arg-type]
    ],
    ids=repr,
)
def test_describe_refuses_by_name(obj: Any, match: str) -> None:
    with pytest.raises(ac.ForeignStreamError, match=match) as caught:
        describe(obj, "after")
    assert isinstance(caught.value, ac.InvalidArgument)  # `except InvalidArgument` holds


# -- the host server: every CUDA object refused by name, at the call ---------------------


@pytest.fixture
async def host() -> AsyncIterator[ac.ComputeClient]:
    async with ac.open_client("host") as client:
        yield client


@pytest.mark.parametrize("call", ["wait", "after"])
@pytest.mark.parametrize(
    "obj", [ProtocolStream(), TorchStream(0x10), TorchEvent(0), Event(5), 0, 0x7F00], ids=repr
)
async def test_host_refuses_gpu_work_by_name(host: ac.ComputeClient, call: str, obj: Any) -> None:
    with pytest.raises(ac.ForeignStreamError, match=rf"client\.{call}\(.*host server"):
        getattr(host, call)(obj)
    assert not host._channel._pending  # nothing was queued
    h = host.create(b"still serving")
    assert await host.read([h]) == [b"still serving"]


async def test_host_refuses_an_unsupported_type_first(host: ac.ComputeClient) -> None:
    with pytest.raises(ac.ForeignStreamError, match="takes a CUDA stream or event"):
        host.wait(object())
    await host.sync()


async def test_a_capture_refuses_both(host: ac.ComputeClient) -> None:
    for call in ("wait", "after"):
        with pytest.raises(ac.GraphCaptureError, match=call):
            async with host.capture():
                getattr(host, call)(ProtocolStream())
    await host.sync()


# -- the channel's half, through a server that accepts foreign work ----------------------


class _Slow(HostCompletion[None]):
    """Done when the test says so; counts how often its result was taken."""

    taken = 0

    def result(self) -> None:
        type(self).taken += 1
        return super().result()


class Accepting(ac.HostServer):
    """Accepts every foreign object but handle 0xBAD, capturing a token for it; each wait
    completes when the test completes it (from a thread, as a driver would), each after
    is logged in order with the executes, with the capture it took."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[_Slow] = []
        self.log: list[tuple[str, Any, ac.StreamId]] = []
        self.fail_after: BaseException | None = None
        self.dropped: list[object] = []
        self.taken: list[object] = []

    def capture_foreign(self, work: ForeignWork) -> None:
        if work.handle == 0xBAD:
            raise ac.ForeignStreamError(f"{work.where()}: refused by the fake")
        work.captured, work.drop = ("capture", work.handle), self.dropped.append

    def foreign_wait(self, work: ForeignWork, stream: ac.StreamId) -> Any:
        self.taken.append(work.take())
        done = _Slow()
        self.waits.append(done)
        self.log.append(("wait", work, stream))
        return done

    def foreign_after(self, work: ForeignWork, stream: ac.StreamId) -> None:
        self.log.append(("after", work, stream))
        self.taken.append(work.take())
        if self.fail_after is not None:
            raise self.fail_after

    def execute(self, kernel: Any, count: Any, bindings: Any, mode: Any, stream: Any) -> None:
        self.log.append(("execute", kernel.id, stream))
        super().execute(kernel, count, bindings, mode, stream)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[ac.ComputeClient, Accepting]]:
    server = Accepting()
    client = ac.ComputeClient(server, current_backend("test").loop, batch_seconds=1e-6)
    try:
        yield client, server
    finally:
        await client.close()


async def test_wait_settles_when_the_work_is_done_and_the_loop_runs_meanwhile(
    fake: tuple[ac.ComputeClient, Accepting],
) -> None:
    client, server = fake
    obj = ProtocolStream(0x5A5A)
    fut = client.wait(obj)
    (done,) = server.waits
    assert server.log == [("wait", server.log[0][1], ac.StreamId.current())]
    assert server.taken == [("capture", 0x5A5A)] and not server.dropped  # captured at the call
    del obj
    ticks = 0

    async def complete_later() -> None:
        await anyio.sleep(0.05)
        done.set_result(None)  # as a driver would: the channel hears of it, not polls

    async with anyio.create_task_group() as tg:
        tg.start_soon(complete_later)
        with anyio.fail_after(5):
            while not fut.done():  # counting the loop's turns meanwhile
                ticks += 1
                await anyio.sleep(0.001)
    assert await fut is None
    assert ticks >= 10  # the loop ran while it waited
    assert _Slow.taken >= 1 and not client._channel._pending


async def test_a_cancelled_wait_leaves_nothing_behind(
    fake: tuple[ac.ComputeClient, Accepting],
) -> None:
    client, server = fake
    taken = _Slow.taken
    with anyio.move_on_after(0.02) as scope:
        await client.wait(TorchStream(0x33))
    assert scope.cancelled_caught
    (done,) = server.waits
    done.set_result(None)  # the foreign work ends later: its completion is still freed
    with anyio.fail_after(5):
        while _Slow.taken == taken:  # noqa: ASYNC110 - set from a timer thread's callback
            await anyio.sleep(0.001)
    await client.sync()
    gc.collect()
    assert not client._channel._pending
    assert await client.read([client.create(b"ok")]) == [b"ok"]


async def test_after_is_ordered_like_a_command_of_its_task(
    fake: tuple[ac.ComputeClient, Accepting],
) -> None:
    client, server = fake
    launch = (NOOP, ac.CubeCount(1), ac.Bindings())

    async def task(i: int) -> ac.StreamId:
        client.execute(*launch)
        client.after(TorchEvent(0xE0 + i))
        client.execute(*launch)
        return ac.StreamId.current()

    streams = [await in_task(task, i) for i in range(2)]
    await client.sync()
    per_stream = [[(op, what) for op, what, s in server.log if s == stream] for stream in streams]
    for i, ops in enumerate(per_stream):
        assert [op for op, _ in ops] == ["execute", "after", "execute"]
        assert ops[1][1].handle == 0xE0 + i and ops[1][1].kind == "event"


async def test_a_failed_after_is_held_for_the_next_awaited_call(
    fake: tuple[ac.ComputeClient, Accepting],
) -> None:
    client, server = fake
    server.fail_after = ac.DeviceError("the fake driver refused the wait")
    client.after(ProtocolStream())
    with pytest.raises(ac.DeviceError, match="the fake driver refused"):
        await client.sync()
    server.fail_after = None
    h = client.create(np.arange(4, dtype=np.uint32))
    assert await client.read([h]) == [np.arange(4, dtype=np.uint32).tobytes()]


async def test_a_refused_object_queues_nothing(fake: tuple[ac.ComputeClient, Accepting]) -> None:
    client, server = fake
    for call in (client.wait, client.after):
        with pytest.raises(ac.ForeignStreamError, match="refused by the fake"):
            call(0xBAD)
    assert server.log == [] and not client._channel._pending
    await client.sync()


async def test_a_wait_cancelled_before_it_ran_gives_its_capture_back(
    fake: tuple[ac.ComputeClient, Accepting],
) -> None:
    client, server = fake
    client.flush()  # spends this loop iteration's inline budget (1 µs): the rest queues
    fut = client.wait(ProtocolStream(0x77))
    assert not server.log  # queued for the actor, its capture taken already
    fut.cancel()
    await client.sync()
    gc.collect()
    assert server.log == [] and server.taken == []
    assert server.dropped == [("capture", 0x77)]  # back to the server, not leaked
    assert not client._channel._pending


async def test_a_wait_raises_the_error_held_for_its_stream_first(
    fake: tuple[ac.ComputeClient, Accepting],
) -> None:
    client, server = fake
    server.fail_after = ac.DeviceError("an earlier after failed")
    client.after(ProtocolStream())  # fire-and-forget: its error is held
    await _until(lambda: server.log)
    server.fail_after = None
    fut = client.wait(ProtocolStream())
    await _until(lambda: server.waits)  # the actor ran it (this iteration's budget: 1 µs)
    server.waits[-1].set_result(None)
    with pytest.raises(ac.DeviceError, match="an earlier after failed"):
        await fut
    await client.sync()  # raised once, not again


async def _until(ready: Any) -> None:
    with anyio.fail_after(5):
        while not ready():  # noqa: ASYNC110 - the actor sets nothing a test can await
            await anyio.sleep(0.001)
