"""Another library's GPU work, as a server sees it (``client.wait``/``client.after``).

The client turns whatever the user passed (an object with ``__cuda_stream__``, a torch or
CuPy stream or event, a raw handle) into a :class:`ForeignWork`: a stream or an event,
its raw driver handle, and the object itself, kept alive until the server has used the
handle (a CuPy stream dropped right after ``client.after(stream)`` is destroyed by its
finalizer; the command may still be queued then). A server gives it three operations
(see :class:`~.protocol.ComputeServer`): ``check_foreign`` (at the call, pure),
``foreign_wait`` (a completion once the work queued so far on it is done) and
``foreign_after`` (the calling task's stream waits for it on the device).
"""

from __future__ import annotations

from typing import Any, Final, Literal

__all__ = ["DEFAULT_STREAMS", "ForeignWork", "Kind"]

Kind = Literal["stream", "event"]
"""What a foreign object stands for."""

DEFAULT_STREAMS: Final = frozenset({0, 1, 2})
"""The NULL stream, ``CU_STREAM_LEGACY`` and ``CU_STREAM_PER_THREAD``: handles that name
the current context's default stream rather than one object of a given context."""


class ForeignWork:
    """A stream or event of another library, described for a server.

    Attributes:
        kind: ``"stream"`` (work queued on it so far) or ``"event"`` (the work its
            last record captured).
        handle: The raw ``CUstream``/``CUevent`` (0 for an event: never recorded, so
            there is nothing to wait for; for a stream: the NULL stream).
        name: What the object is, for messages (``"torch.cuda.streams.Stream"``).
        call: The client method it was passed to (``"wait"``, ``"after"``).
        device: The CUDA device index the object declares, where it declares one.
        owner: The object itself, kept alive while a queued command refers to it.
    """

    __slots__ = ("call", "device", "handle", "kind", "name", "owner")

    def __init__(
        self,
        kind: Kind,
        handle: int,
        name: str,
        call: str,
        device: int | None = None,
        owner: Any = None,
    ) -> None:
        self.kind = kind
        self.handle = handle
        self.name = name
        self.call = call
        self.device = device
        self.owner = owner

    def __repr__(self) -> str:
        return f"ForeignWork({self.kind}, {self.label}, device={self.device})"

    @property
    def label(self) -> str:
        """The object and its handle, as messages name it (``"torch... 0x5a00"``)."""
        return f"{self.name} {self.handle:#x}"

    def where(self) -> str:
        """``client.wait(<label>)``: the call, for the start of a message."""
        return f"client.{self.call}({self.label})"
