"""The client's memory and profiling commands: thin delegates to their parts.

:class:`ClientSurface` is :class:`~.client.ComputeClient`'s base: the methods here
forward to the memory part (:class:`~.memory.ClientMemory`) and the profiler part
(:class:`~.profiler.ClientProfiler`), which the client creates in its ``__init__``.
Keeping them here leaves ``client.py`` to the hot path and the commands that
compose several parts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from ..config.pools import MemoryLayout
from ..memory.management import MemoryReport
from ..profiling.records import ProfileSummary
from ..values.types import (
    MemoryAllocationMode,
    MemoryUsage,
    ProfileDuration,
    ProfilingToken,
)
from .memory import ClientMemory
from .profiler import ClientProfiler

__all__ = ["ClientSurface"]


class ClientSurface:
    """The memory and profiling half of :class:`~.client.ComputeClient`'s API."""

    _memory: ClientMemory
    _profiler: ClientProfiler
    profile_summary: ProfileSummary
    sync: Callable[[], asyncio.Future[None]]

    @property
    def dry_run(self) -> bool:
        """True for a dry run's client (``open_client(device, dry_run=True)``): launches
        are recorded, not run; memory is accounted, not mapped; reads give zeros."""
        return bool(getattr(self._memory.server, "dry_run", False))

    # -- memory (the memory part) --------------------------------------------------------

    def memory_usage(self) -> asyncio.Future[MemoryUsage]:
        """Current memory usage (awaitable)."""
        return self._memory.memory_usage()

    def memory_report(self) -> asyncio.Future[MemoryReport]:
        """Usage, pages and peaks of each memory pool (awaitable; an HTML table in Jupyter)."""
        return self._memory.memory_report()

    def memory_cleanup(self) -> None:
        """Release memory nothing uses."""
        self._memory.memory_cleanup()

    async def set_memory_layout(self, layout: MemoryLayout) -> None:
        """Replace the memory pools in place: the work queued so far finishes, every pool
        is emptied and its pages given back to the device (or host), then ``layout``'s
        pools serve every later allocation.

        Raises:
            MemoryInUse: buffers of this client are still alive (nothing is changed):
                drop them first, or open a new client with the layout.
            InvalidArgument: ``layout`` is not a :class:`~asynccube.MemoryLayout`.
            MemoryLayoutError: the layout does not fit this device (a sliced pool's cap
                below one page once aligned).
        """
        await self._memory.set_memory_layout(layout, self.sync)

    def allocation_mode(self, mode: MemoryAllocationMode) -> None:
        """Switch which pools new allocations come from (AUTO or PERSISTENT)."""
        self._memory.allocation_mode(mode)

    # -- profiling (the profiler part) ---------------------------------------------------

    def start_profile(self) -> ProfilingToken:
        """Start a profile of the work queued from now on; profiles nest and overlap."""
        return self._profiler.start_profile()

    def end_profile(self, token: ProfilingToken) -> asyncio.Future[ProfileDuration]:
        """End ``token``'s profile; the future gives its duration."""
        return self._profiler.end_profile(token)

    def profile(
        self, name: str | None = None
    ) -> AbstractAsyncContextManager[list[ProfileDuration]]:
        """``async with client.profile("step") as out:`` profiles the block.

        ``out[0]`` is the duration once the block has exited; a named profile is also
        added to :attr:`profile_summary`.
        """
        return self._profiler.profile(name, self.profile_summary)
