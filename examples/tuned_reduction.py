"""A tuned reduction: the sum of a float32 vector, with the CUDA block size autotuned.

One CUDA source is compiled once per block size (``-DBLOCK=<n>``); each variant is a
tunable, and an :class:`asynccube.Tuner` benchmarks them per (anchored) vector length
on the device, then remembers the fastest on disk. Every kernel also has a numpy part,
so the same program runs on the host server where no GPU is present.

    python examples/tuned_reduction.py                 # cuda:0 if usable, else host
    python examples/tuned_reduction.py --device host --n 1000000 --mode background

Kernel ABI (see the README): buffer pointers in order (``x``, ``out``), then scalars
grouped by dtype (here a single ``uint32`` ``n``), then metadata (none here).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

import asynccube as ac

BLOCK_SIZES = (64, 128, 256, 512, 1024)
"""Threads per block of each variant."""
MAX_CUBES = 2048
"""Blocks at most; each thread then sums several elements (grid-stride loop)."""

SUM_CUDA = r"""
#ifndef BLOCK
#error "compile with -DBLOCK=<threads per block, a power of two>"
#endif
extern "C" __global__ void sum_f32(const float* __restrict__ x, float* __restrict__ out,
                                   unsigned int n) {
    __shared__ float partial[BLOCK];
    const unsigned int tid = threadIdx.x;
    const unsigned int step = gridDim.x * BLOCK;
    float acc = 0.0f;
    for (unsigned int i = blockIdx.x * BLOCK + tid; i < n; i += step) {
        acc += x[i];
    }
    partial[tid] = acc;
    __syncthreads();
    for (unsigned int stride = BLOCK / 2; stride > 0; stride >>= 1) {
        if (tid < stride) {
            partial[tid] += partial[tid + stride];
        }
        __syncthreads();
    }
    if (tid == 0) {
        atomicAdd(out, partial[0]);
    }
}
"""


def _sum_host(block: int) -> Callable[[ac.HostLaunch], None]:
    """The numpy part: ``out[0] += sum(x[:n])``, summed in rows of ``block`` like the
    device's blocks (so variants differ on the host too)."""

    def run(launch: ac.HostLaunch) -> None:
        x = launch.buffers[0].view(np.float32)
        out = launch.buffers[1].view(np.float32)
        n = int(launch.scalar(np.uint32))
        padded = np.zeros(-(-n // block) * block, dtype=np.float32)
        padded[:n] = x[:n]
        out[0] += padded.reshape(-1, block).sum(axis=1, dtype=np.float32).sum(dtype=np.float32)

    return run


def sum_kernel(block: int) -> ac.Kernel:
    """The sum kernel with ``block`` threads per block."""
    cuda = ac.CudaSource(
        SUM_CUDA, entry="sum_f32", block=(block, 1, 1), options=(f"-DBLOCK={block}",)
    )
    return ac.Kernel(f"example_sum_f32_b{block}", cuda=cuda, host=_sum_host(block))


class SumKey(ac.AutotuneKey):
    """Vectors whose lengths anchor to the same power of two share a result."""

    n: int


def _launcher(block: int) -> Callable[[ac.ComputeClient, ac.Tensor], Awaitable[ac.Tensor]]:
    kernel = sum_kernel(block)

    async def launch(client: ac.ComputeClient, x: ac.Tensor) -> ac.Tensor:
        n = x.shape[0]
        out = client.create_array(np.zeros(1, dtype=np.float32))
        cubes = max(1, min(-(-n // block), MAX_CUBES))
        bindings = (
            ac.Bindings().with_buffers([x.binding(), out.binding()]).with_scalar(np.uint32, [n])
        )
        client.execute(kernel, ac.CubeCount(cubes), bindings)
        return out

    launch.__name__ = f"block_{block}"
    return launch


def _key(x: ac.Tensor) -> SumKey:
    if len(x.shape) != 1 or x.dtype != np.float32:
        raise ac.InvalidArgument(f"tuned_sum needs a 1-D float32 tensor, got {x!r}")
    if x.shape[0] >= 2**31:
        raise ac.InvalidArgument("tuned_sum supports fewer than 2**31 elements")
    return SumKey(n=ac.anchor(x.shape[0], min=1024))


SUM: ac.TunableSet[SumKey, ac.Tensor, ac.Tensor] = ac.TunableSet(
    _key, version="1", default="block_256", tunables=[_launcher(b) for b in BLOCK_SIZES]
)
"""The variants; 256 threads serve calls while a key is tuned in the background."""


def make_tuner(
    cache_dir: str | Path | None = None,
    *,
    mode: ac.TuneMode = ac.TuneMode.BLOCKING,
    samples: int = 10,
) -> ac.Tuner:
    """A tuner for :data:`SUM` that also checks the variants agree."""
    checks = ac.TuneChecks(rtol=1e-4, atol=1e-3, strict=True)
    return ac.Tuner(
        "example_sum_f32", mode=mode, samples=samples, cache_dir=cache_dir, checks=checks
    )


async def tuned_sum(client: ac.ComputeClient, tuner: ac.Tuner, x: ac.Tensor) -> float:
    """The sum of ``x``, by the fastest variant for its length."""
    out = await tuner.execute(client, SUM, x)
    (value,) = await client.read_array(out)
    return float(value)


async def main(args: argparse.Namespace) -> None:
    """Sum a random vector, tuned, and show what the tuner found."""
    tuner = make_tuner(args.cache_dir, mode=ac.TuneMode(args.mode))
    async with ac.open_client(args.device) as client:
        data = np.random.default_rng(0).random(args.n, dtype=np.float32)
        x = client.create_array(data)
        start = time.perf_counter()
        total = await tuned_sum(client, tuner, x)
        first = time.perf_counter() - start
        await tuner.wait()
        start = time.perf_counter()
        total = await tuned_sum(client, tuner, x)
        again = time.perf_counter() - start
        result = tuner.result(client, SUM.generate_key(x))
        print(f"device {client.device} ({client.properties.name}), n = {args.n}")
        print(f"sum = {total:.6g} (numpy float64: {data.sum(dtype=np.float64):.6g})")
        print(f"first call {first * 1e3:.1f} ms (with tuning if the key was new)")
        print(f"second call {again * 1e3:.2f} ms")
        if result is not None:
            print(f"fastest: {result.fastest_name} (from {result.source})")
            for outcome in result.outcomes:
                print(f"  {outcome}")
        print(f"cache file: {tuner.cache(client).path}")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="host, cuda:N (default: auto)")
    parser.add_argument("--n", type=int, default=1 << 22, help="vector length")
    parser.add_argument("--cache-dir", default=None, help="autotune cache root")
    parser.add_argument("--mode", default="blocking", choices=[m.value for m in ac.TuneMode])
    parser.add_argument("-v", "--verbose", action="store_true", help="log autotune INFO")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = _parse()
    if arguments.verbose:
        os.environ.setdefault("ASYNCCUBE_AUTOTUNE_LOGGING", "minimal")
        logging.basicConfig(level=logging.INFO)
    asyncio.run(main(arguments))
