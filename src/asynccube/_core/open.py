"""Opening clients: ``open_client()`` (async context manager) and ``connect()``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from .client import ComputeClient
from .config import (
    CODE_SOURCE,
    AsyncCubeConfig,
    ConfigOverrides,
    config_keys,
    load_effective_config,
)
from .devices import make_server, parse_device

__all__ = ["connect", "open_client"]


async def connect(
    device: str | None = None, *, config: ConfigOverrides | AsyncCubeConfig | None = None
) -> ComputeClient:
    """Open a client on ``device`` (``"host"``, ``"cuda"``, ``"cuda:N"``; default: the
    first usable GPU, else the host). For notebooks: ``await client.close()`` later.

    ``config`` sets configuration values in code, over the file and the environment, as
    ``{"section": {"key": value}}`` (e.g. ``{"streaming": {"max_streams": 4}}``),
    validated like the file: an unknown key or a bad value raises ConfigError.
    """
    loop = asyncio.get_running_loop()
    if device is not None:
        parse_device(device)  # a bad device string fails before any blocking work
    if isinstance(config, AsyncCubeConfig):
        resolved, from_code = config, frozenset(f"{s}.{k}" for s, k, _ in config_keys(config))
    else:
        effective = await loop.run_in_executor(None, load_effective_config, None, None, config)
        resolved = effective.config
        from_code = frozenset(k for k, src in effective.sources.items() if src == CODE_SOURCE)
    server = await make_server(device, resolved)
    client = ComputeClient(server, loop)
    client.config, client.config_from_code = resolved, from_code
    return client


@asynccontextmanager
async def open_client(
    device: str | None = None, *, config: ConfigOverrides | AsyncCubeConfig | None = None
) -> AsyncIterator[ComputeClient]:
    """``async with open_client() as client:`` — a client closed when the block ends.

    ``config``: configuration values set in code, as for :func:`connect`.
    """
    client = await connect(device, config=config)
    async with client:
        yield client
