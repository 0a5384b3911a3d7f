"""The collectives' staged path (host clients, CUDA without NCCL, mixed host and CUDA):
the buffers read, the result made with numpy, written into each client's buffer.

One engine (:func:`staged_run`) for every collective, given what to read, what each
client's buffer receives (a function of the read bytes) and where to write it. Every
command is queued at the call, on each client, on the caller's stream: the reads; on
the first client, the computation once every read is in (in a worker thread when it
is large); on each client, a write of its part, which waits for the computation
without blocking the loop (the actor waits, so the client's later commands come after
the write; a client with nothing to write waits the same way, and holds the failure).
No cycle of waits: within the call every write waits only on reads queued before it,
and every call queues all of its commands at once. A failure (a read of a tainted
buffer, a dead client) is held for the caller's stream on every client as a
:class:`~asynccube.CollectiveError`; the buffers keep their bytes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import numpy.typing as npt

from ..errors import CollectiveError
from ..values.stream_id import StreamId
from ..values.types import Binding, CopyDescriptor

if TYPE_CHECKING:
    from .client import ComputeClient

__all__ = ["INLINE_BYTES", "Staged", "failed", "reduce_arrays", "staged_run"]

INLINE_BYTES: Final = 1 << 20
"""Computations over fewer bytes (all inputs together) run on the loop; larger ones in
the first client's worker thread (numpy's ufuncs and copies release the GIL)."""

_UFUNCS: Final = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum}

Compute = Callable[[list[Any]], list["npt.NDArray[Any] | None"]]
"""The read bytes (in the order of the reads) -> each write's data (None: no write)."""


class Staged:
    """What one staged collective does: ``reads`` ((client, binding, bytes) read from
    the start of each binding), ``writes`` ((client, binding or None), one per client,
    the first one's client computing), ``compute`` (see :data:`Compute`), ``work``
    (bytes the computation touches: a worker thread from :data:`INLINE_BYTES`) and
    ``what`` (the collective's name, for its errors)."""

    __slots__ = ("compute", "reads", "what", "work", "writes")

    def __init__(
        self,
        reads: Sequence[tuple[ComputeClient, Binding, int]],
        writes: Sequence[tuple[ComputeClient, Binding | None]],
        compute: Compute,
        work: int,
        what: str,
    ) -> None:
        self.reads, self.writes, self.compute = reads, writes, compute
        self.work, self.what = work, what


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


def staged_run(plan: Staged) -> None:
    """Queue the staged collective ``plan`` on every client (see above)."""
    stream = StreamId.current()
    reads = [_read(client, binding, nbytes) for client, binding, nbytes in plan.reads]
    first = plan.writes[0][0]
    computed: asyncio.Future[Any] = first.loop.create_future()
    first._channel.track(computed)  # fails at once if the first client dies before it
    first._channel.send(_compute_when_read, first, reads, computed, plan)
    for i, (client, binding) in enumerate(plan.writes):
        client._channel.send(
            _write_when_computed, _Write(client, binding, computed, i, stream, plan)
        )


def _read(client: ComputeClient, binding: Binding, nbytes: int) -> asyncio.Future[Any]:
    desc = CopyDescriptor(binding, (nbytes,), (1,), 1)
    fut = client._movement.read_arrays([desc])  # the host's: no copy on the loop
    if fut is None:
        fut = client._channel.request(client._movement.read_on_actor, StreamId.current(), [desc])
    fut.add_done_callback(_looked_at)  # looked at by the computation, not by the user
    return fut


def _looked_at(fut: asyncio.Future[Any]) -> None:
    """Nothing: adding it marks an internal client future as awaited (no warning)."""


def _compute_when_read(
    first: ComputeClient,
    reads: list[asyncio.Future[Any]],
    computed: asyncio.Future[Any],
    plan: Staged,
) -> Any:
    small = plan.work < INLINE_BYTES
    if small and all(r.done() for r in reads):
        try:
            value = plan.compute(_results(reads))
        except BaseException as exc:
            _fail(computed, exc)
            return None
        _succeed(computed, value)
        return None
    return _compute_later(first, reads, computed, plan, small)


async def _compute_later(
    first: ComputeClient,
    reads: list[asyncio.Future[Any]],
    computed: asyncio.Future[Any],
    plan: Staged,
    small: bool,
) -> None:
    backend = first._channel.backend
    try:
        for read in reads:
            if not read.done():
                await backend.wait(read)  # request futures: a dead channel fails them
        arrays = _results(reads)
        if small:
            value = plan.compute(arrays)
        else:
            value = await first._jobs.run(lambda: plan.compute(arrays))
    except BaseException as exc:
        _fail(computed, exc)
        if isinstance(exc, backend.cancelled):
            raise  # the actor is being cancelled: the writes see the failure
        return
    _succeed(computed, value)


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


class _Write:
    """One client's write of a staged collective: item ``index`` of the computation's
    result (``computed``) into ``binding`` (``None``: nothing to write; the client only
    holds a failure), on the caller's ``stream``."""

    __slots__ = ("binding", "client", "computed", "index", "plan", "stream")

    def __init__(
        self,
        client: ComputeClient,
        binding: Binding | None,
        computed: asyncio.Future[Any],
        index: int,
        stream: StreamId,
        plan: Staged,
    ) -> None:
        self.client, self.binding, self.computed = client, binding, computed
        self.index, self.stream, self.plan = index, stream, plan


def _write_when_computed(w: _Write) -> Any:
    if w.computed.done():
        return _write(w)
    return _write_later(w)


async def _write_later(w: _Write) -> None:
    client = w.client
    await client._channel.backend.wait(w.computed)  # tracked by the first client's channel
    client._channel.activate()
    pending = _write(w)
    if pending is not None:
        await pending


def _write(w: _Write) -> Any:
    client, plan = w.client, w.plan
    exc = w.computed.exception()
    if exc is not None:
        client._channel.hold(w.stream, failed(exc, client, len(plan.writes), what=plan.what))
        return None
    value: npt.NDArray[Any] | None = w.computed.result()[w.index]
    if w.binding is None or value is None:
        return None
    data = np.ascontiguousarray(value).view(np.uint8)
    desc = CopyDescriptor(w.binding, (data.nbytes,), (1,), 1)
    return client._movement.write_on_actor(w.stream, [(desc, data)])


def failed(
    exc: BaseException,
    client: ComputeClient,
    n: int,
    touched: bool = False,
    what: str = "all_reduce",
) -> CollectiveError:
    """The error held on ``client``'s stream when the collective ``what`` over ``n``
    buffers failed with ``exc``: before writing its buffer, or (``touched``) maybe after."""
    state = "may have changed (it is tainted)" if touched else "is unchanged"
    error = CollectiveError(
        f"{what} over {n} client(s) failed; the {client.device} buffer {state}: "
        f"{type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error
