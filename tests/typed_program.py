"""A typed user program: ordinary use of asynccube's public API.

``tests/test_typing.py`` keeps it clean under ``mypy --strict`` (with the README's
example and ``examples/``) and runs it on the host server.
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

import asynccube as ac


def saxpy_host(launch: ac.HostLaunch) -> None:
    """out = a * x + y over float32 (a float32 scalar, n a uint32 scalar)."""
    x, y, out = (b.view(np.float32) for b in launch.buffers)
    n = int(launch.scalar(np.uint32))
    out[:n] = launch.scalar(np.float32) * x[:n] + y[:n]


SAXPY = ac.Kernel("typed_program_saxpy", host=saxpy_host)


async def run(device: str = "host") -> tuple[npt.NDArray[np.float32], ac.Timeline]:
    """2 * arange(8) + 1, computed on ``device``, and the timeline of the run."""
    async with ac.open_client(device) as client:
        x: ac.Handle = client.create(np.arange(8, dtype=np.float32))
        y: ac.Tensor = client.create_array(np.ones(8, np.float32))
        out = client.empty(32)
        bindings = (
            ac.Bindings()
            .with_buffers([x, y.handle, out])
            .with_scalar(np.float32, [2.0])
            .with_scalar(np.uint32, [8])
        )
        with ac.StreamId.pinned(3):
            async with client.profile("saxpy") as durations:
                client.execute(SAXPY, ac.CubeCount(1), bindings)
            result: npt.NDArray[np.float32] = await client.read_array(out, np.float32)
        duration: ac.ProfileDuration = durations[0]
        usage: ac.MemoryUsage = await client.memory_usage()
        report: ac.MemoryReport = await client.memory_report()
        pools: list[ac.PoolReport] = list(report.pools)
        summary: ac.ProfileSummary = client.profile_summary
        stats: ac.ProfileStats = summary["saxpy"]
        timeline: ac.Timeline = await client.timeline()
        records: tuple[ac.KernelRecord, ...] = timeline.records
        assert duration.duration_ns >= 0 and usage.bytes_in_use >= 0 and pools
        assert stats.count == 1 and len(records) >= 0
        return result, timeline


if __name__ == "__main__":
    print(asyncio.run(run())[0])
