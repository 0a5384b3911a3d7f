"""Opening clients: ``open_client()`` (async context manager) and ``connect()``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ..channel.backend import current_backend
from ..client.client import ComputeClient
from ..config.config import (
    CODE_SOURCE,
    AsyncCubeConfig,
    ConfigOverrides,
    config_keys,
    load_effective_config,
)
from ..errors import InvalidArgument
from .devices import make_server, parse_device

__all__ = ["connect", "open_client"]


async def connect(
    device: str | None = None,
    *,
    config: ConfigOverrides | AsyncCubeConfig | None = None,
    dry_run: bool = False,
) -> ComputeClient:
    """Open a client on ``device`` (``"host"``, ``"cuda"``, ``"cuda:N"``; default: the
    first usable GPU, else the host). For notebooks: ``await client.close()`` later.

    Runs under asyncio (uvloop included) and trio (directly or through anyio); the
    client belongs to the loop (and trio run) it was opened on. Outside any event loop,
    or under another library, :class:`~asynccube.UnsupportedBackend` says what is needed.

    ``config`` sets configuration values in code, over the file and the environment, as
    ``{"section": {"key": value}}`` (e.g. ``{"streaming": {"max_streams": 4}}``),
    validated like the file: an unknown key or a bad value raises ConfigError.

    ``dry_run=True`` opens a dry run standing for ``device``: launches are checked and
    recorded, not run; memory goes through the configured pools without being mapped;
    reads give zeros. Its ``memory_report().plan()`` is a layout sized for the real run
    (see the memory guide).
    """
    backend = current_backend("connect()")
    if not isinstance(dry_run, bool):
        raise InvalidArgument(f"dry_run must be True or False, got {dry_run!r}")
    if device is not None:
        parse_device(device)  # a bad device string fails before any blocking work
    if isinstance(config, AsyncCubeConfig):
        resolved, from_code = config, frozenset(f"{s}.{k}" for s, k, _ in config_keys(config))
    else:
        effective = await backend.run_sync(load_effective_config, None, None, config)
        resolved = effective.config
        from_code = frozenset(k for k, src in effective.sources.items() if src == CODE_SOURCE)
    server = await make_server(device, resolved, dry_run=dry_run)
    batch = resolved.streaming.batch_us * 1e-6
    client = ComputeClient(server, backend.loop, batch_seconds=batch)
    client.config, client.config_from_code = resolved, from_code
    return client


@asynccontextmanager
async def open_client(
    device: str | None = None,
    *,
    config: ConfigOverrides | AsyncCubeConfig | None = None,
    dry_run: bool = False,
) -> AsyncIterator[ComputeClient]:
    """``async with open_client() as client:`` — a client closed when the block ends.

    ``config``: configuration values set in code; ``dry_run``: a dry run of ``device``;
    both as for :func:`connect`.
    Under asyncio or trio (see :func:`connect`); outside any event loop, or under
    another async library, :class:`~asynccube.UnsupportedBackend` says what is needed.
    """
    client = await connect(device, config=config, dry_run=dry_run)
    async with client:
        yield client
