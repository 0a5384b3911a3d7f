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

from dataclasses import dataclass, field
from typing import Any, Final, Literal

__all__ = ["DEFAULT_STREAMS", "ForeignWork"]

DEFAULT_STREAMS: Final = frozenset({0, 1, 2})
"""The NULL stream, ``CU_STREAM_LEGACY`` and ``CU_STREAM_PER_THREAD``: handles that name
the current context's default stream rather than one object of a given context."""


@dataclass(frozen=True, slots=True)
class ForeignWork:
    """A stream or event of another library, described for a server.

    Attributes:
        kind: ``"stream"`` (work queued on it so far) or ``"event"`` (the work its
            last record captured).
        handle: The raw ``CUstream``/``CUevent`` (0 for an event: never recorded, so
            there is nothing to wait for; for a stream: the NULL stream).
        label: How the object is named in messages (``"torch.cuda.Stream 0x5a…"``).
        call: The client method it was passed to (``"wait"``, ``"after"``).
        device: The CUDA device index the object declares, where it declares one.
        owner: The object itself, kept alive while a queued command refers to it.
    """

    kind: Literal["stream", "event"]
    handle: int
    label: str
    call: str
    device: int | None = None
    owner: Any = field(default=None, repr=False, compare=False)

    def where(self) -> str:
        """``client.wait(<label>)``: the call, for the start of a message."""
        return f"client.{self.call}({self.label})"
