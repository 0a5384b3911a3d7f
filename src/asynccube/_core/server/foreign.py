"""Another library's GPU work, as a server sees it (``client.wait``/``client.after``).

The client turns whatever the user passed (an object with ``__cuda_stream__``, a torch or
CuPy stream or event, a raw handle) into a :class:`ForeignWork`: a stream or an event,
and its raw driver handle. A server gives it three operations (see
:class:`~.protocol.ComputeServer`): ``capture_foreign``, run by the client at the call
(it checks the object and captures the work queued on it *now*, as an event of the
server's own, so a command that waits in the channel's queue, or a library that
re-records its event meanwhile, cannot move what is waited for); then, as ordinary
commands, ``foreign_wait`` (a completion once the captured work is done) and
``foreign_after`` (the calling task's stream waits for it on the device).
"""

from __future__ import annotations

from collections.abc import Callable
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
        captured: What ``capture_foreign`` captured (a server's event), until a command
            takes it (``take``); one never taken goes back through ``drop``.
        drop: Gives back a capture no command took (the command was cancelled before it
            ran, or the client closed); set with ``captured``.
    """

    __slots__ = ("call", "captured", "device", "drop", "handle", "kind", "name")

    def __init__(
        self,
        kind: Kind,
        handle: int,
        name: str,
        call: str,
        device: int | None = None,
    ) -> None:
        self.kind = kind
        self.handle = handle
        self.name = name
        self.call = call
        self.device = device
        self.captured: Any = None
        self.drop: Callable[[Any], object] | None = None

    def take(self) -> Any:
        """The capture, handed to the command that uses it (None: nothing to wait for)."""
        captured, self.captured = self.captured, None
        return captured

    def __del__(self) -> None:
        captured, drop = self.captured, self.drop
        if captured is not None and drop is not None:
            self.captured = None
            drop(captured)

    def __repr__(self) -> str:
        return f"ForeignWork({self.kind}, {self.label}, device={self.device})"

    @property
    def label(self) -> str:
        """The object and its handle, as messages name it (``"torch... 0x5a00"``)."""
        return f"{self.name} {self.handle:#x}"

    def where(self) -> str:
        """``client.wait(<label>)``: the call, for the start of a message."""
        return f"client.{self.call}({self.label})"
