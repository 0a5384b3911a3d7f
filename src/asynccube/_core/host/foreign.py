"""Host side of ``client.wait(obj)`` / ``client.after(obj)``: refused, by name.

Every object these calls take (a CUDA stream or event of torch, CuPy, cuda.core, or a
raw handle) stands for work on a GPU, which the host server cannot see: it has no
device, no context and no events of the driver's to order its work with. Waiting on it
anyway would need a thread blocked in that library's ``synchronize()``, and pretending
it is done would let a program that runs on the host pass a test it fails on a GPU.
So the host server refuses each at the call, with :class:`~asynccube.ForeignStreamError`
naming the object, and the client keeps serving.
"""

from __future__ import annotations

from typing import NoReturn

from ..errors import ForeignStreamError
from ..server.foreign import ForeignWork
from ..server.protocol import Completion
from ..values.stream_id import StreamId

__all__ = ["HostForeign", "refuse"]


def refuse(work: ForeignWork) -> NoReturn:
    """Raise the host server's ForeignStreamError for ``work``."""
    raise ForeignStreamError(
        f"{work.where()}: that {work.kind} is GPU work, and this client runs on the host "
        "server (numpy), which has no GPU to order it with; open a CUDA client "
        "(ac.open_client('cuda:0')) to await another library's GPU work, or call that "
        "library's synchronize() in a worker thread"
    )


class HostForeign:
    """The host server's ``capture_foreign``/``foreign_wait``/``foreign_after``: each
    refuses (see above)."""

    __slots__ = ()

    def capture_foreign(self, work: ForeignWork) -> None:
        """Refuse ``work`` (ForeignStreamError): the host server has no GPU."""
        refuse(work)

    def foreign_wait(self, work: ForeignWork, stream: StreamId) -> Completion[None]:
        """Refuse ``work`` (the client's ``capture_foreign`` already did)."""
        refuse(work)

    def foreign_after(self, work: ForeignWork, stream: StreamId) -> None:
        """Refuse ``work`` (the client's ``capture_foreign`` already did)."""
        refuse(work)
