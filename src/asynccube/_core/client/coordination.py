"""The client's commands that coordinate with the world outside its own streams: a
read into the caller's buffer, waiting for another library's GPU work, and exclusive
access to the device. :class:`ClientCoordination` is a base of
:class:`~.client.ComputeClient`; each method is a thin delegate to its module
(:mod:`.movement`, :mod:`.foreign`, :mod:`.exclusive`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..values.types import Binding, CopyDescriptor, Handle
from . import foreign
from .args import _whole
from .exclusive import exclusive, exclusive_call
from .movement import DataMovement
from .tensor import Tensor

if TYPE_CHECKING:
    from .foreign import ForeignClient
    from .parts import ClientParts

__all__ = ["ClientCoordination"]

T = TypeVar("T")


class ClientCoordination:
    """``read_into``, ``wait``/``after`` and ``exclusive``/``exclusive_call`` of
    :class:`~.client.ComputeClient` (see the module docstring)."""

    _movement: DataMovement

    def read_into(
        self, source: Tensor | Binding | Handle | CopyDescriptor, out: Any
    ) -> asyncio.Future[None]:
        """Read ``source`` (densely packed) into ``out``, a writable contiguous buffer
        of exactly its size (``bytearray``, a numpy array, a :meth:`staging` buffer),
        instead of new ``bytes`` (awaitable).

        No host copy at all from a staging buffer on CUDA (the device writes into it),
        one otherwise; on the host server the worker packs straight into ``out``. Do
        not touch ``out`` until the read is awaited. A service can answer with ``out``
        as its body (``web.Response(body=out)``) without another copy.
        """
        if isinstance(source, Tensor):
            desc = source.copy_descriptor()
        elif isinstance(source, CopyDescriptor):
            desc = source
        else:
            desc = _whole(source)
        return self._movement.read_into(desc, out)

    def wait(self, obj: Any) -> asyncio.Future[None]:
        """Completes once the work queued so far on another library's stream or event
        is done, without blocking the loop (awaitable, cancellable; asyncio or trio).

        ``obj``: an object with ``__cuda_stream__``, a ``torch.cuda.Stream``/``Event``,
        a CuPy ``Stream``/``Event``, a ``cuda.bindings`` ``CUstream``/``CUevent``, or a
        raw stream handle (int). ForeignStreamError, at the call, for another device's,
        a destroyed or an unsupported one, and for any on the host server (no GPU).
        """
        return foreign.wait(cast("ForeignClient", self), obj)

    def after(self, obj: Any) -> None:
        """Make the calling task's stream wait, on the device, for the work queued so far
        on another library's stream or event (fire-and-forget, ordered like an execute;
        ``obj`` as for :meth:`wait`): later kernels of the task see its results."""
        foreign.after(cast("ForeignClient", self), obj)

    def exclusive(self) -> AbstractAsyncContextManager[None]:
        """``async with client.exclusive():`` runs the block with the device to itself
        (cubecl's ``exclusive``), e.g. for another library: entering waits for the
        client's turn and for the work queued before it to complete on the device;
        inside, the block's task (and the tasks it starts there) runs as usual while
        every other task's commands are held, without blocking the loop, until the
        block ends however it ends. Misuse raises :class:`ExclusiveAccessError`. See
        the guide, "Exclusive access"."""
        return exclusive(cast("ClientParts", self))

    async def exclusive_call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` run in a worker thread with the device to itself (as
        :meth:`exclusive`, until ``fn`` returns, even if the caller is cancelled); its
        result. If ``fn`` raises, :class:`ExclusiveCallError` carries its message (the
        original as ``__cause__``) and the client keeps serving; ``fn`` must not call
        this client (:class:`ExclusiveAccessError`)."""
        return await exclusive_call(cast("ClientParts", self), fn, *args)
