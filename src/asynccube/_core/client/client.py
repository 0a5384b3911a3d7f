"""ComputeClient: the public face of a server, driven through the channel.

The commands themselves live in :mod:`.client_core` (:class:`~.client_core.ClientCore`);
this module adds profiling, the timeline, numpy helpers and the lifecycle.
"""

from __future__ import annotations

import asyncio
import itertools
import warnings
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from ..channel.channel import BATCH_SECONDS, State
from ..config.config import AsyncCubeConfig
from ..config.logging import area_logger
from ..errors import InvalidArgument, ProfileError
from ..memory.management import MemoryReport
from ..profiling.records import ProfileSummary
from ..profiling.timeline import Timeline
from ..server.protocol import ComputeServer
from ..values.stream_id import StreamId
from ..values.types import (
    AllocationKind,
    Binding,
    CopyDescriptor,
    Handle,
    ProfileDuration,
    ProfilingToken,
)
from .args import _array_layout, _dims, _numeric_dtype, _same_as_tensor, _whole
from .commands import ClientCore
from .graph import Graph, capture, release_graphs
from .interop import import_dlpack, tensor_strides
from .tensor import Tensor
from .transfer import to_client

__all__ = ["ComputeClient"]

_log = area_logger("profiling")
_NOT_RECORDING = (
    "nothing is recorded below profiling level 'medium': set [profiling] level = "
    '"medium" (or "full") in asynccube.toml, or ASYNCCUBE_PROFILING_LEVEL=medium, '
    "before opening the client"
)


class ComputeClient(ClientCore):
    """Sends work to one server through an actor task on the current event loop
    (asyncio, uvloop included, or trio).

    Create it with :func:`open_client` (``async with``) or :func:`connect`. Every method
    must be called from the loop the client was opened on (other threads: use
    ``asyncio.run_coroutine_threadsafe(coro, client.loop)``, or under trio
    ``trio.from_thread.run(fn, trio_token=client.loop.token)``); a call from elsewhere
    raises LoopMismatchError. Methods returning futures queue their command at once, so
    ``fut = client.read(...)`` orders the read before any later call even before it is
    awaited. ``batch_seconds`` bounds the commands run in one loop iteration before the
    client yields (``streaming.batch_us`` when opened through ``open_client``).
    """

    def __init__(
        self,
        server: ComputeServer,
        loop: asyncio.AbstractEventLoop,
        *,
        batch_seconds: float = BATCH_SECONDS,
    ) -> None:
        super().__init__(server, loop, batch_seconds=batch_seconds)
        self._profile_ids = itertools.count(1)
        self._profiles: dict[int, ProfilingToken] = {}
        self._closing: asyncio.Future[Any] | None = None
        self.profile_summary = ProfileSummary()
        """Named profiles (``client.profile(name)``) aggregated: count, total, mean..."""
        self.config: AsyncCubeConfig | None = None
        """The configuration the client was opened with (``open_client``/``connect``)."""
        self.config_from_code: frozenset[str] = frozenset()
        """The ``"section.key"`` values set in code (``open_client(config=...)``)."""

    # -- profiling ----------------------------------------------------------------------

    def start_profile(self) -> ProfilingToken:
        """Start a profile of the work queued from now on; profiles nest and overlap."""
        self._channel.check()
        token = ProfilingToken(next(self._profile_ids))
        self._send_fire(self._start_profile, token)
        return token

    def _start_profile(self, token: ProfilingToken, stream: StreamId) -> None:
        self._profiles[token.id] = self._server.start_profile(stream)

    def end_profile(self, token: ProfilingToken) -> asyncio.Future[ProfileDuration]:
        """End ``token``'s profile; the future gives its duration."""
        self._channel.check()
        if not isinstance(token, ProfilingToken):
            raise InvalidArgument(f"expected a ProfilingToken, got {token!r}")
        return self._request(self._end_profile, token)

    def _end_profile(self, token: ProfilingToken, stream: StreamId) -> Any:
        server_token = self._profiles.pop(token.id, None)
        if server_token is None:
            raise ProfileError(f"{token} was never started or has already ended")
        return self._server.end_profile(stream, server_token)

    @asynccontextmanager
    async def profile(self, name: str | None = None) -> AsyncIterator[list[ProfileDuration]]:
        """``async with client.profile("step") as out:`` profiles the block.

        ``out[0]`` is the duration once the block has exited; a named profile is also
        added to :attr:`profile_summary`.
        """
        token = self.start_profile()
        out: list[ProfileDuration] = []
        try:
            yield out
        finally:
            duration = await self.end_profile(token)
            out.append(duration)
            if name is not None:
                self.profile_summary.add(name, duration)

    async def timeline(self) -> Timeline:
        """The kernels and copies recorded so far, per stream, once queued work is done.

        Records are kept at profiling level ``medium`` or ``full`` (config
        ``[profiling] level`` or ``ASYNCCUBE_PROFILING_LEVEL``). ``timeline.save(path)``
        writes a Chrome trace / Perfetto JSON file; in Jupyter it renders as a plot.
        """
        await self.sync()
        channel = self._channel
        records = await channel.request(
            channel.call, StreamId.current(), self._server.kernel_records
        )
        recorder = getattr(self._server, "recorder", None)
        hint = "" if recorder is None or recorder.enabled else _NOT_RECORDING
        if hint:
            _log.warning("timeline(): %s", hint)
        return Timeline(records, device=self.device, hint=hint)

    def memory_report(self) -> asyncio.Future[MemoryReport]:
        """Usage, pages and peaks of each memory pool (awaitable; an HTML table in Jupyter)."""
        self._channel.check()
        channel = self._channel
        return channel.request(channel.call, StreamId.current(), self._server.memory_report)

    # -- numpy helpers ------------------------------------------------------------------

    def create_array(self, array: npt.ArrayLike) -> Tensor:
        """A new tensor holding a copy of ``array`` (contiguous layout)."""
        # An ndarray goes as it is (a strided one too): the host server borrows a large
        # one and packs it off the loop; anything else is converted here.
        arr = array if type(array) is np.ndarray and array.ndim else np.ascontiguousarray(array)
        handle = self.create(arr)
        return Tensor(handle, arr.shape, tensor_strides(arr.shape, None), arr.dtype, self)

    def empty_array(
        self,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
        kind: AllocationKind = AllocationKind.CONTIGUOUS,
    ) -> Tensor:
        """A new uninitialized tensor of ``shape`` and ``dtype`` (numeric or bool)."""
        dt, dims = _numeric_dtype("empty_array: dtype", dtype), _dims("empty_array: shape", shape)
        ((handle, strides),) = self.empty_tensors([dims], [dt.itemsize], kind)
        return Tensor(handle, dims, strides, dt, self)

    def tensor(
        self,
        handle: Handle,
        shape: Sequence[int],
        dtype: npt.DTypeLike,
        strides: Sequence[int] | None = None,
    ) -> Tensor:
        """A typed view of ``handle`` (C-contiguous unless ``strides``, in elements,
        are given) that exports through DLPack (``np.from_dlpack(view)``)."""
        view = Tensor(handle, shape, tensor_strides(shape, strides), dtype, self)
        needed = view.nbytes_spanned()
        if needed > handle.size:
            raise InvalidArgument(
                f"{view!r} addresses {needed} bytes but {handle!r} holds {handle.size}"
            )
        return view

    def from_dlpack(self, obj: Any) -> Tensor:
        """A tensor over ``obj``'s memory, without a copy (a numpy array on the host
        server; a torch or CuPy tensor on the same GPU, whose work is ordered before
        this task's stream). ``obj`` stays alive while the
        tensor, its bindings or queued work refer to it; its memory never enters the
        pools. DLPackError names what stands in the way (another device, strides,
        dtype, read-only memory)."""
        handle, shape, dtype = import_dlpack(self, obj)
        return Tensor(handle, shape, tensor_strides(shape, None), dtype, self)

    async def read_array(
        self,
        source: Tensor | Binding | Handle,
        dtype: npt.DTypeLike | None = None,
        shape: Sequence[int] | None = None,
    ) -> npt.NDArray[Any]:
        """Read a tensor (or a buffer, given ``dtype`` and optionally ``shape``) into a
        new numpy array of the right dtype and shape."""
        if isinstance(source, Tensor):
            _same_as_tensor(source, dtype, shape)
            self._channel.check()
            return await self._read_new(source.copy_descriptor(), source.dtype, source.shape)
        if dtype is None:
            raise InvalidArgument("read_array of a Handle or Binding needs dtype=")
        dt, dims = _array_layout(source, dtype, shape)
        self._channel.check()
        return await self._read_new(_whole(source), dt, dims, source)

    async def _read_new(
        self,
        desc: CopyDescriptor,
        dt: np.dtype[Any],
        dims: tuple[int, ...] | None,
        buffer: Binding | Handle | None = None,
    ) -> npt.NDArray[Any]:
        """``read_array``'s read: a new array of ``desc``'s data, made by the server off
        the loop where it can (host), else copied from the bytes read."""
        # No local keeps a future: a failed one's error would hold this frame (its
        # traceback) and the frame the future, a cycle only the gc breaks (issue 28).
        pending: list[Any] = [self._read_arrays([desc])]
        flat: npt.NDArray[Any]
        if pending[0] is not None:
            (raw,) = await _take(pending)
            flat = raw.view(dt)
        else:
            pending[0] = self.read_tensor([desc]) if buffer is None else self.read([buffer])
            (raw,) = await _take(pending)
            flat = np.frombuffer(raw, dtype=dt).copy()
        return flat if dims is None else flat.reshape(dims)

    # -- graphs and other clients ---------------------------------------------------------

    def capture(self) -> AbstractAsyncContextManager[Graph]:
        """``async with client.capture() as graph:`` records the calling task's commands
        (executes, writes, copies) into a graph instead of running them; then
        ``graph.replay()`` runs them (fire-and-forget, ordered like an execute).

        A read, a sync, an allocation that needs a new page and other operations that
        cannot be recorded raise :class:`GraphCaptureError` naming them, and end the
        capture. On CUDA this is a stream capture instantiated once; on the host server
        the command list is kept and run again.
        """
        return capture(self)

    def to_client(self, handle: Handle | Binding, other: ComputeClient) -> Handle:
        """A new handle in ``other`` holding the bytes of ``handle`` (fire-and-forget).

        Between GPUs that reach each other: a peer copy; otherwise staged through
        (pinned) host memory. Ordered on both sides: the copy sees the work queued on
        ``handle`` so far; ``other``'s later work on the new handle sees the copy.
        """
        return to_client(self, handle, other)

    # -- lifecycle ----------------------------------------------------------------------

    async def close(self) -> None:
        """Finish queued work, release the server, and refuse every later call.

        Raises the first fire-and-forget error nobody awaited (others attached as
        notes), after closing. Closing again is a no-op.
        """
        channel = self._channel
        if channel.state is State.OPEN:
            release_graphs(self)
            self._closing = channel.begin_close()
        try:
            if self._closing is not None and not self._closing.done():
                await channel.backend.shield(self._closing)
            await channel.wait_actor()
        finally:
            self._jobs.close()

    async def __aenter__(self) -> ComputeClient:
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            await self.close()
        except Exception as error:
            if not isinstance(exc, BaseException):
                raise
            # The block's own exception propagates; the close error is not lost with it.
            exc.add_note(f"closing the client also raised {type(error).__name__}: {error}")

    def __del__(self) -> None:
        channel = getattr(self, "_channel", None)
        if channel is not None and channel.state is State.OPEN:
            warnings.warn(
                f"unclosed {self!r}: use `async with open_client() as client:` or "
                "`await client.close()`",
                ResourceWarning,
                source=self,
                stacklevel=2,
            )


async def _take(pending: list[Any]) -> Any:
    """Await the future in ``pending``, taking it out first (see ``_read_new``)."""
    return await pending.pop()
