"""The profiling part of a client: profiles started and ended in stream order (they nest
and overlap), and the timeline of the kernels and copies the server recorded."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ..channel.channel import Channel
from ..config.logging import area_logger
from ..errors import InvalidArgument, ProfileError
from ..profiling.records import ProfileSummary
from ..profiling.timeline import Timeline
from ..server.protocol import ComputeServer
from ..values.stream_id import StreamId
from ..values.types import ProfileDuration, ProfilingToken
from .dispatch import Dispatch

__all__ = ["ClientProfiler"]

_log = area_logger("profiling")
_NOT_RECORDING = (
    "nothing is recorded below profiling level 'medium': set [profiling] level = "
    '"medium" (or "full") in asynccube.toml, or ASYNCCUBE_PROFILING_LEVEL=medium, '
    "before opening the client"
)


class ClientProfiler:
    """One client's profiles and timeline (see above); the methods that check the
    channel are named after the client's (the capture guard names the caller)."""

    __slots__ = ("_channel", "_dispatch", "_ids", "_profiles", "_server")

    def __init__(self, server: ComputeServer, channel: Channel, dispatch: Dispatch) -> None:
        self._server = server
        self._channel = channel
        self._dispatch = dispatch
        self._ids = itertools.count(1)
        self._profiles: dict[int, ProfilingToken] = {}  # by token id: the server's token

    def start_profile(self) -> ProfilingToken:
        """See :meth:`ComputeClient.start_profile`."""
        self._channel.check()
        token = ProfilingToken(next(self._ids))
        self._dispatch.fire(self._start, token)
        return token

    def _start(self, token: ProfilingToken, stream: StreamId) -> None:
        self._profiles[token.id] = self._server.start_profile(stream)

    def end_profile(self, token: ProfilingToken) -> asyncio.Future[ProfileDuration]:
        """See :meth:`ComputeClient.end_profile`."""
        self._channel.check()
        if not isinstance(token, ProfilingToken):
            raise InvalidArgument(f"expected a ProfilingToken, got {token!r}")
        return self._dispatch.request(self._end, token)

    def _end(self, token: ProfilingToken, stream: StreamId) -> Any:
        server_token = self._profiles.pop(token.id, None)
        if server_token is None:
            raise ProfileError(f"{token} was never started or has already ended")
        return self._server.end_profile(stream, server_token)

    @asynccontextmanager
    async def profile(
        self, name: str | None, summary: ProfileSummary
    ) -> AsyncIterator[list[ProfileDuration]]:
        """See :meth:`ComputeClient.profile` (a named profile is added to ``summary``)."""
        token = self.start_profile()
        out: list[ProfileDuration] = []
        try:
            yield out
        finally:
            duration = await self.end_profile(token)
            out.append(duration)
            if name is not None:
                summary.add(name, duration)

    async def timeline(self, device: str) -> Timeline:
        """The records kept so far (the caller synced first), with a hint where the
        profiling level keeps none."""
        channel = self._channel
        records = await channel.request(
            channel.call, StreamId.current(), self._server.kernel_records
        )
        recorder = getattr(self._server, "recorder", None)
        hint = "" if recorder is None or recorder.enabled else _NOT_RECORDING
        if hint:
            _log.warning("timeline(): %s", hint)
        return Timeline(records, device=device, hint=hint)
