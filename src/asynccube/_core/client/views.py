"""How a tensor's exports (:mod:`.interop`) see a tensor and the client that made it, as
protocols: :mod:`.interop` is written against them, so it imports neither :mod:`.tensor`
(whose DLPack methods call it) nor the client (which makes tensors).
:mod:`.parts` does the same for the client's helper modules."""

from __future__ import annotations

import weakref
from typing import Any, Protocol

import numpy as np

from ..channel.channel import Channel
from ..server.protocol import ComputeServer
from ..values.types import Binding, Handle

__all__ = ["TensorClient", "TensorView"]


class TensorClient(Protocol):
    """What a tensor's exports and imports need of its client: the server, the channel
    (to run what is queued first) and the device string."""

    _server: ComputeServer
    _channel: Channel

    @property
    def device(self) -> str:
        """The device string (``"host"``, ``"cuda:0"``)."""
        ...


class TensorView(Protocol):
    """What an export needs of a tensor (:class:`~.tensor.Tensor` is one)."""

    _client: weakref.ReferenceType[TensorClient] | None
    handle: Handle
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: np.dtype[Any]

    def nbytes_spanned(self) -> int:
        """Bytes from the first element to just past the last one addressed."""
        ...

    def binding(self) -> Binding:
        """A binding over the tensor's buffer."""
        ...
