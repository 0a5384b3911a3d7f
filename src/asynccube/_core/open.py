"""Opening clients: ``open_client()`` (async context manager) and ``connect()``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .client import ComputeClient
from .devices import make_server

__all__ = ["connect", "open_client"]


async def connect(device: str | None = None) -> ComputeClient:
    """Open a client on ``device`` (``"host"``, ``"cuda"``, ``"cuda:N"``; default: the
    first usable GPU, else the host). For notebooks: ``await client.close()`` later."""
    loop = asyncio.get_running_loop()
    server = await make_server(device)
    return ComputeClient(server, loop)


@asynccontextmanager
async def open_client(device: str | None = None) -> AsyncIterator[ComputeClient]:
    """``async with open_client() as client:`` — a client closed when the block ends."""
    client = await connect(device)
    async with client:
        yield client
