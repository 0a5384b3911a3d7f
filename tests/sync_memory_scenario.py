"""The storm of ``sync_storm.py`` on the real client -> channel -> CudaServer path
against the no-op driver of ``benchmarks/bench_overhead.py`` (every sync is taken by
``FastSync``: the device is always done). Run in its own process by
``tests/test_memory_after_sync.py``; prints ``ok NAME PATH`` or raises."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
import bench_overhead  # noqa: E402

bench_overhead.install_fake()

from asynccube._core.client.client import ComputeClient  # noqa: E402
from asynccube._core.cuda.native.hotpath import ACTIVE  # noqa: E402
from tests.sync_storm import storm_then_usage  # noqa: E402


async def cancelled_before_sync() -> None:
    """memory_usage() after one sync counts the cancelled tasks' buffers as free."""
    client = ComputeClient(bench_overhead._server(), asyncio.get_running_loop())
    await client.sync()
    before = await client.memory_usage()
    after = await storm_then_usage(client, check=False)
    assert client._fast_sync is not None and client._fast_sync.hits > 0
    assert (after.number_allocs, after.bytes_in_use) == (0, 0), (before, after)
    await client.close()


if __name__ == "__main__":
    asyncio.run(cancelled_before_sync())
    print("ok cancelled_before_sync", ACTIVE)
