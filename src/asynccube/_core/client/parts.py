"""How the client's helper modules (:mod:`.arrays`, :mod:`.graph`, :mod:`.transfer`)
see :class:`~.client.ComputeClient`, as a protocol: the client imports them, so they
cannot import it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Protocol

from ..server.protocol import ComputeServer
from ..values.types import Binding, Handle
from .jobs import JobThread
from .memory import ClientMemory
from .movement import DataMovement
from .views import TensorClient

__all__ = ["ClientParts"]


class ClientParts(TensorClient, Protocol):
    """What the helper modules see of a client: its parts and the few public members
    they use."""

    _jobs: JobThread
    _fast: Any
    _server: ComputeServer
    _graph_registry: Any
    _memory: ClientMemory
    _movement: DataMovement

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The client's event loop."""
        ...

    @property
    def closed(self) -> bool:
        """True once the client is closed."""
        ...

    @property
    def server(self) -> ComputeServer:
        """The client's server."""
        ...

    def read(self, bindings: Sequence[Binding | Handle]) -> asyncio.Future[list[bytes]]:
        """The bytes of each binding (awaitable)."""
        ...
