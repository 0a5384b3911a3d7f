"""Which part bounds the pipeline over two GPUs (diagnostic): the staged pipeline's
steps run as variants, each timed alone with 256 items of 4 MiB in flight (items per
second, the loop thread's CPU per item, and the one-call routes' hits and declines).

    python benchmarks/profile_pipeline_steps.py [ITEMS] [DEV0,DEV1]   # cuda:0,cuda:1
    python benchmarks/profile_pipeline_steps.py 16 host,host           # anywhere

Variants: create -> read_into on one device (the copies alone); both kernels on one
device; create -> to_client -> read_into across the two; the whole pipeline, with all
items in flight and with 16 or 64 at a time. Loop CPU equal to the wall time means the
driving loop, not the device, bounds the variant. Prints; writes nothing.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import ray_pipeline as rp

import asynccube as ac

SIZE = 1 << 20  # float32 elements: 4 MiB an item


async def variant(
    name: str, devs: list[str], n: int, kernels: bool, peer: bool, limit: int | None = None
) -> None:
    """Time one variant: two rounds, the second reported."""
    a = await ac.connect(devs[0])
    b = await ac.connect(devs[1]) if devs[1] != devs[0] else a
    items = rp.make_items(n, SIZE)
    ins = await a.staging([x.nbytes for x in items])
    for buf, x in zip(ins, items, strict=True):
        np.copyto(buf, x.view(np.uint8).reshape(-1))
    outs = await b.staging([x.nbytes for x in items])
    for o in outs:
        o.fill(1)
    first, second = rp.Stage(devs[0], 2.0, 1.0), rp.Stage(devs[1], 0.5, -1.0)
    first.client, second.client = a, b
    gate = asyncio.Semaphore(limit or n)

    async def one(i: int) -> None:
        async with gate:
            h = a.create(ins[i])
            if kernels:
                first._run(h, SIZE)
            if peer and b is not a:
                h = a.to_client(h, b)
            if kernels:
                second._run(h, SIZE)
            await b.read_into(h, outs[i])

    wall = cpu = 0.0
    for _ in range(2):
        c0, t0 = time.thread_time(), time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    routes = f"a {getattr(a._fast, 'stats', None)} b {getattr(b._fast, 'stats', None)}"
    print(
        f"{name:45s} {n / wall:7.0f} items/s  loop CPU {cpu / n * 1e6:6.0f} µs/item  "
        f"wall {wall / n * 1e6:6.0f} µs/item  routes (hits, declined) {routes}",
        flush=True,
    )
    await a.close()
    if b is not a:
        await b.close()


async def main(n: int, d0: str, d1: str) -> None:
    await variant("one device: create -> read_into", [d0, d0], n, False, False)
    await variant("one device: both kernels", [d0, d0], n, True, False)
    await variant("two devices: create -> to_client -> read_into", [d0, d1], n, False, True)
    await variant("two devices: the pipeline", [d0, d1], n, True, True)
    await variant("two devices: the pipeline, 16 in flight", [d0, d1], n, True, True, 16)
    await variant("two devices: the pipeline, 64 in flight", [d0, d1], n, True, True, 64)


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    devices = sys.argv[2].split(",") if len(sys.argv) > 2 else ["cuda:0", "cuda:1"]
    asyncio.run(main(count, devices[0], devices[1]))
