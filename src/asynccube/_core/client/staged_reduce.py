"""``all_reduce``'s staged path (host clients, CUDA without NCCL, mixed host and CUDA):
each buffer read, the reduction made with numpy, the result written back into each.

Every command is queued at the call, on each client, on the caller's stream: a read on
each client; on the first, the reduction once every read is in (in a worker thread
when it is large); on each, a write of the result, which waits for the reduction
without blocking the loop (the actor waits, so the client's later commands come after
the write). No cycle of waits: within the call every write waits only on reads queued
before it, and every call queues all of its commands at once. A failure (a read of a
tainted buffer, a dead client) is held for the caller's stream on every client as a
:class:`~asynccube.CollectiveError`; the buffers keep their bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import CollectiveError
from ..values.stream_id import StreamId
from ..values.types import Binding, CopyDescriptor

if TYPE_CHECKING:
    from .client import ComputeClient

__all__ = ["INLINE_BYTES", "failed", "reduce_arrays", "staged"]

INLINE_BYTES: Final = 1 << 20
"""Reductions over fewer bytes (all inputs together) run on the loop; larger ones in
the first client's worker thread (numpy's ufuncs release the GIL)."""

_UFUNCS: Final = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}

Pair = tuple["ComputeClient", Binding]


def reduce_arrays(arrays: Sequence[Any], dtype: np.dtype[Any], op: str, count: int) -> Any:
    """The element-wise reduction of the first ``count`` elements of each buffer in
    ``arrays`` (numpy semantics: integers wrap around; min/max propagate NaN)."""
    ufunc = _UFUNCS[op]
    views = [np.frombuffer(a, dtype=dtype, count=count) for a in arrays]
    out = views[0].copy()
    with np.errstate(all="ignore"):  # overflow gives inf, as on the device
        for view in views[1:]:
            ufunc(out, view, out=out)
    return out


def staged(pairs: Sequence[Pair], dtype: np.dtype[Any], op: str, count: int) -> None:
    """Queue the staged all-reduce of ``count`` elements on every client (see above)."""
    stream = StreamId.current()
    nbytes = count * dtype.itemsize
    reads = [_read(client, binding, nbytes) for client, binding in pairs]
    first = pairs[0][0]
    reduced: asyncio.Future[Any] = first.loop.create_future()
    first._channel.track(reduced)  # fails at once if the first client dies before it
    first._channel.send(_reduce_when_read, first, reads, reduced, dtype, op, count)
    for client, binding in pairs:
        client._channel.send(_write_when_reduced, client, binding, reduced, stream, len(pairs))


def _read(client: ComputeClient, binding: Binding, nbytes: int) -> asyncio.Future[Any]:
    desc = CopyDescriptor(binding, (nbytes,), (1,), 1)
    fut = client._movement.read_arrays([desc])  # the host's: no copy on the loop
    if fut is None:
        fut = client._channel.request(client._movement.read_on_actor, StreamId.current(), [desc])
    fut.add_done_callback(_looked_at)  # looked at by the reduction, not by the user
    return fut


def _looked_at(fut: asyncio.Future[Any]) -> None:
    """Nothing: adding it marks an internal client future as awaited (no warning)."""


def _reduce_when_read(
    first: ComputeClient,
    reads: list[asyncio.Future[Any]],
    reduced: asyncio.Future[Any],
    dtype: np.dtype[Any],
    op: str,
    count: int,
) -> Any:
    small = count * dtype.itemsize * len(reads) < INLINE_BYTES
    if small and all(r.done() for r in reads):
        try:
            value = reduce_arrays(_results(reads), dtype, op, count)
        except BaseException as exc:
            _fail(reduced, exc)
            return None
        _succeed(reduced, value)
        return None
    return _reduce_later(first, reads, reduced, dtype, op, count, small)


async def _reduce_later(
    first: ComputeClient,
    reads: list[asyncio.Future[Any]],
    reduced: asyncio.Future[Any],
    dtype: np.dtype[Any],
    op: str,
    count: int,
    small: bool,
) -> None:
    backend = first._channel.backend
    try:
        for read in reads:
            if not read.done():
                await backend.wait(read)  # request futures: a dead channel fails them
        arrays = _results(reads)
        if small:
            value = reduce_arrays(arrays, dtype, op, count)
        else:
            value = await first._jobs.run(lambda: reduce_arrays(arrays, dtype, op, count))
    except BaseException as exc:
        _fail(reduced, exc)
        if isinstance(exc, backend.cancelled):
            raise  # the actor is being cancelled: the writes see the failure
        return
    _succeed(reduced, value)


def _results(reads: list[asyncio.Future[Any]]) -> list[Any]:
    """Each read's bytes, or the first read's error with the others' attached."""
    errors = [e for e in (r.exception() for r in reads) if e is not None]
    if errors:
        first = errors[0]
        for other in errors[1:]:
            first.add_note(f"another buffer's read failed too: {type(other).__name__}: {other}")
        raise first
    return [r.result()[0] for r in reads]


def _succeed(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _fail(fut: asyncio.Future[Any], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
        fut.exception()  # retrieved: each write looks at it


def _write_when_reduced(
    client: ComputeClient, binding: Binding, reduced: asyncio.Future[Any], stream: StreamId, n: int
) -> Any:
    if reduced.done():
        return _write(client, binding, reduced, stream, n)
    return _write_later(client, binding, reduced, stream, n)


async def _write_later(
    client: ComputeClient, binding: Binding, reduced: asyncio.Future[Any], stream: StreamId, n: int
) -> None:
    await client._channel.backend.wait(reduced)  # tracked by the first client's channel
    client._channel.activate()
    pending = _write(client, binding, reduced, stream, n)
    if pending is not None:
        await pending


def _write(
    client: ComputeClient, binding: Binding, reduced: asyncio.Future[Any], stream: StreamId, n: int
) -> Any:
    exc = reduced.exception()
    if exc is not None:
        client._channel.hold(stream, failed(exc, client, n))
        return None
    value: npt.NDArray[Any] = reduced.result()
    data = value.view(np.uint8)
    desc = CopyDescriptor(binding, (data.nbytes,), (1,), 1)
    return client._movement.write_on_actor(stream, [(desc, data)])


def failed(
    exc: BaseException, client: ComputeClient, n: int, touched: bool = False
) -> CollectiveError:
    """The error held on ``client``'s stream when the all-reduce of ``n`` buffers failed
    with ``exc``: before writing its buffer, or (``touched``) maybe after."""
    what = "may have changed (it is tainted)" if touched else "is unchanged"
    error = CollectiveError(
        f"all_reduce over {n} client(s) failed; the {client.device} buffer {what}: "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error
