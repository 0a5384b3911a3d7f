"""CUDA side of array interop: where a tensor's bytes are, and on which stream the work
asynccube queued on them runs (``__cuda_array_interface__`` v3 ``stream``); what keeps
an exported buffer valid after its client closes, and the gates that order a consumer
after work the channel has not issued yet (:mod:`.exports`)."""

from __future__ import annotations

from typing import Any

from ..errors import DLPackError, InvalidHandle
from ..memory.slice import SliceHandle
from ..values.stream_id import StreamId
from ..values.types import Binding, Handle
from .driver import check, cu, error_from
from .exports import Gate, Lease
from .native.hotpath import ACTIVE, hot
from .state import ServerCore

__all__ = ["InteropOps"]


class InteropOps(ServerCore):
    """Export hooks used by :mod:`asynccube._core.client.interop`."""

    one_call_export = ACTIVE == "native"
    """A DLPack export with a consumer stream takes ``FastLaunch.export`` (the buffer's
    stamp, the event and the consumer's wait in one call) before the route below. Only
    with the compiled module: the twin's route (the same steps, tested as such) costs
    more than this class's own path (9.8 against 13.0 µs on the no-op driver)."""

    def export_pointer(self, binding: Binding, stream: StreamId) -> tuple[int, int]:
        """The device address of ``binding`` and the raw handle of the CUDA stream
        after whose queued work it is complete (the calling task's stream, made to wait
        for any other stream that used the buffer; nothing is synchronized)."""
        ptr = self._ptr(binding)  # InvalidHandle for a freed or foreign handle
        resolved = self._streams.resolve(stream, (binding,))
        return ptr, int(resolved.stream)

    def export_to_stream(
        self, binding: Binding, stream: StreamId, consumer: int | None
    ) -> tuple[int, Lease]:
        """The device address of ``binding`` and the export's lease (the capsule keeps
        it until the consumer's deleter runs), with the consumer's CUDA stream (a raw
        handle; None: no ordering, the DLPack ``stream=-1``) made to wait, on the
        device, for the work asynccube queued on it: an event recorded on asynccube's
        stream and ``cuStreamWaitEvent``; nothing is synchronized."""
        ptr = self._ptr(binding)
        resolved = self._streams.resolve(stream, (binding,))
        lease = self.export_lease(binding)
        if consumer is None:
            return ptr, lease
        self.check_consumer(consumer)
        event = self._events.record(resolved.stream)
        err = hot.stream_wait_event(consumer, event)
        self._events.give(event)  # the wait captured the event's state
        if err:
            raise error_from(err, "cuStreamWaitEvent")
        return ptr, lease

    def export_gated(
        self, binding: Binding, consumer: int | None
    ) -> tuple[int, Lease, Gate | None]:
        """Like :meth:`export_to_stream`, for an export that commands still queued in
        the channel must precede (a launch behind a compile): the consumer's stream
        waits on the device for a gate (None for ``stream=-1``) that
        :meth:`open_gate`, queued after them, opens. Nothing waits on the host."""
        self._refuse_behind_a_load()
        ptr = self._queued_ptr(binding)
        lease = self.export_lease(binding)
        if consumer is None:
            return ptr, lease, None
        self.check_consumer(consumer)
        return ptr, lease, self._gates.wait(cu().CUstream(consumer))

    def pointer_gated(self, binding: Binding) -> tuple[int, int, Gate]:
        """``__cuda_array_interface__``'s address and stream for a buffer that commands
        still queued in the channel must precede: the stream handed to the consumer is
        the server's export stream, made to wait for a gate :meth:`open_gate` opens."""
        self._refuse_behind_a_load()
        ptr = self._queued_ptr(binding)
        if self._export_stream is None:
            flags = int(cu().CUstream_flags.CU_STREAM_NON_BLOCKING)
            self._export_stream = check(cu().cuStreamCreate(flags), "cuStreamCreate(export)")
            self._backend.created.append(self._export_stream)
        return ptr, int(self._export_stream), self._gates.wait(self._export_stream)

    def _refuse_behind_a_load(self) -> None:
        """DLPackError while a kernel is compiled and loaded in a worker thread: loading
        a module synchronizes the device, so a consumer's stream made to wait on the
        device for the launch behind it would hold the load, and the load the launch
        (measured on an H200: every such gate stayed closed until its watchdog)."""
        if self._loads[0] != self._loads[1]:
            raise DLPackError(
                "cannot export this tensor yet: a kernel launched before this export is "
                "still being compiled and loaded in a worker thread (its first launch, or "
                "a warm-up scope's compile: warm up before serving), "
                "and the driver synchronizes the device to load it, so a consumer made to "
                "wait for that launch would deadlock; `await client.sync()` (or any "
                "awaited call) once after a kernel's first launch, then export"
            )

    def _queued_ptr(self, binding: Binding) -> int:
        """The address of ``binding``, or DLPackError where its buffer has none yet:
        its ``create`` is itself queued behind the worker-thread job (the address is
        what a consumer needs now, and it is only known once the buffer is made)."""
        try:
            return self._ptr(binding)
        except InvalidHandle:
            token, table = binding.memory, self._table
            if token.queue is not table.queue or table.queue.closed:
                raise
            if token.id in table.failed:
                raise
            raise DLPackError(
                "cannot export this tensor yet: its buffer is created by a command queued "
                "behind a worker-thread job (a kernel's first compile), so it has no "
                "address to hand out; `await client.sync()` (or any awaited call) first"
            ) from None

    def open_gate(self, gate: Gate, binding: Binding, stream: StreamId) -> None:
        """Open ``gate`` on ``stream``'s CUDA stream once the work queued on
        ``binding`` so far is ordered before it (run as a command, after the commands
        the export was queued behind)."""
        try:
            resolved = self._streams.resolve(stream, (binding,))
        except BaseException:
            gate.open_now()
            raise
        gate.open_on(resolved.stream)

    def export_event(self) -> int:
        """The raw handle of the event the one-call export records (``FastLaunch.export``):
        one per server, taken from the pool at the first export and given back at close.
        One serves every export: a stream's wait captures the event's state when issued."""
        handle: int = self._export_event_handle
        if not handle:
            event = self._events.take()
            self.close_hooks.append(lambda: self._events.give(event))
            handle = self._export_event_handle = int(event)
        return handle

    def export_lease(self, binding: Binding) -> Lease:
        """A lease on the export of ``binding``, keeping what its memory belongs to
        where that is not the pools (an imported producer's consumed capsule)."""
        owner = self._table.get(binding)
        return self._exports.take(None if isinstance(owner, SliceHandle) else owner)

    def check_consumer(self, consumer: int) -> None:
        """DLPackError unless the stream ``consumer`` (a raw handle) belongs to this
        device's context; the default streams (1, 2) are every context's."""
        if consumer == 1 or consumer == 2:
            return
        err, context, _, _ = hot.stream_check(consumer)  # one compiled call
        if err:
            raise error_from(err, "cuStreamGetCtx")
        if context != self._ctx.handle:
            raise DLPackError(
                f"__dlpack__(stream={consumer:#x}): that stream belongs to another device "
                f"or context than this tensor's (cuda:{self._ctx.ordinal}); pass a stream "
                "of this device"
            )

    def after_legacy(self, stream: StreamId) -> None:
        """Make ``stream``'s CUDA stream wait, on the device, for the work queued so far
        on the legacy default stream: where a DLPack producer asked with ``stream=1``
        ordered its earlier work (torch and CuPy on their default stream order nothing
        then: it is that stream). An event recorded there and ``cuStreamWaitEvent``,
        two compiled calls; nothing waits on the host."""
        current = self._streams.streams.get(stream).stream
        event = self._events.record(1)  # CU_STREAM_LEGACY, a raw handle
        err = hot.stream_wait_event(current, event)
        self._events.give(event)  # the wait captured the event's state
        if err:
            raise error_from(err, "cuStreamWaitEvent(import)")

    def stream_handle(self, stream: StreamId) -> int:
        """The raw handle of the CUDA stream ``stream`` runs on (what a DLPack
        producer is asked to order its work before)."""
        return int(self._streams.streams.get(stream).stream)

    def import_copied(
        self, handle: Handle, address: int, nbytes: int, owner: Any, stream: StreamId
    ) -> None:
        """Bind ``handle`` to a pool buffer holding a copy of outside device memory
        (DLPack import with ``copy=True`` of a producer that copies to the host only).
        The copy runs on the legacy default stream, which the producer ordered its
        earlier work before (``__dlpack__(stream=1)``) and which its later work on any
        blocking stream (torch's and CuPy's default streams) waits for; ``stream``
        waits for the copy, and ``owner`` (the consumed capsule) is kept until the
        device has passed it."""
        self.create([handle], stream)
        binding = handle.binding()
        resolved = self._streams.resolve(stream, (binding,))
        legacy = cu().CUstream(1)
        if nbytes:
            check(
                cu().cuMemcpyDtoDAsync(self._ptr(binding), address, nbytes, legacy),
                "cuMemcpyDtoDAsync(import copy)",
            )
        event = self._events.record(legacy)
        err = hot.stream_wait_event(resolved.stream, event)
        self._events.give(event)
        if err:
            raise error_from(err, "cuStreamWaitEvent(import copy)")
        self._retirer.hold(resolved.stream, owner)

    def import_pointer(
        self, handle: Handle, address: int, nbytes: int, owner: Any, stream: StreamId
    ) -> None:
        """Bind ``handle`` to outside device memory (DLPack import). ``owner`` stands
        where a pool slice would: dropped with the handle once the device has passed
        the last use (the retirer), so the producer's memory is never pooled."""
        handle_id = handle.memory.id
        cursor = self._streams.resolve(stream, ()).cursor
        self._table.bind(handle_id, owner)
        self._addresses[handle_id] = (address, nbytes)
        handle.cursor = cursor
        self._created(handle_id, (stream, cursor))
