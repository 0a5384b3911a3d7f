"""Interop: host cost of handing memory between asynccube and other array libraries,
beside the same exchange between those libraries, in the same run; every exchange is
checked to share memory (same address).

    python benchmarks/bench_interop.py [--device host|cuda:0] [--n 100000]

Host server: ``np.from_dlpack(tensor)`` (export) and ``client.from_dlpack(array)``
(import) beside ``np.from_dlpack(array)`` between numpy arrays. On a GPU:
``torch.from_dlpack(tensor)``, ``cupy.from_dlpack(tensor)``, and
``torch.as_tensor(tensor, device="cuda")`` and ``cupy.asarray(tensor)`` (through
``__cuda_array_interface__``) beside ``torch.utils.dlpack``/``cupy.from_dlpack`` between
torch and CuPy. Writes ``results/interop*.md|json`` for ``report.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import environment, table, write

import asynccube as ac

ROUNDS = 2000
TWICE = ac.Kernel(
    "bench_interop_twice",
    cuda=ac.CudaSource(
        'extern "C" __global__ void twice(float* x, unsigned int n) {'
        " unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }",
        "twice",
    ),
)
"""Doubles a float32 buffer in place: the kernel between the DLPack import and export."""


def per_call_us(fn: Callable[[], Any], rounds: int = ROUNDS) -> float:
    """Median over 5 batches of the mean host time of one call, in µs."""
    batches = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(rounds):
            fn()
        batches.append((time.perf_counter() - start) / rounds * 1e6)
    return sorted(batches)[2]


async def host_rows(n: int) -> tuple[list[list[Any]], dict[str, Any]]:
    async with ac.open_client("host") as client:
        t = client.create_array(np.arange(n, dtype=np.float32))
        await client.sync()
        peer = np.arange(n, dtype=np.float32)
        out = np.from_dlpack(t)
        same = out.ctypes.data == np.from_dlpack(t).ctypes.data
        export = per_call_us(lambda: np.from_dlpack(t))
        numpy_peer = per_call_us(lambda: np.from_dlpack(peer))
        imported = client.from_dlpack(peer)
        shared = (await client.read_array(imported))[1] == peer[1]
        importing = per_call_us(lambda: client.from_dlpack(peer), rounds=200)
        await client.sync()
    rows = [
        ["export: np.from_dlpack(tensor)", f"{export:.2f}", f"{numpy_peer:.2f}",
         f"{export / numpy_peer:.2f}x", "yes" if same else "NO"],
        ["import: client.from_dlpack(ndarray)", f"{importing:.2f}", f"{numpy_peer:.2f}",
         f"{importing / numpy_peer:.2f}x", "yes" if shared else "NO"],
    ]  # fmt: skip
    figures = {"export_us": export, "import_us": importing, "numpy_dlpack_us": numpy_peer}
    return rows, figures


async def gpu_rows(device: str, n: int) -> tuple[list[list[Any]], dict[str, Any]]:
    import cupy
    import torch

    async with ac.open_client(device) as client:
        t = client.create_array(np.arange(n, dtype=np.float32))
        await client.sync()
        ptr = t.__cuda_array_interface__["data"][0]
        tt = torch.as_tensor(t, device="cuda")
        cc = cupy.asarray(t)
        torch_cai = per_call_us(lambda: torch.as_tensor(t, device="cuda"), rounds=500)
        cupy_cai = per_call_us(lambda: cupy.asarray(t), rounds=500)
        td = torch.from_dlpack(t)
        cd = cupy.from_dlpack(t)
        torch_dl = per_call_us(lambda: torch.from_dlpack(t), rounds=500)
        cupy_dl = per_call_us(lambda: cupy.from_dlpack(t), rounds=500)
        await client.sync()
        warm = ac.Bindings().with_buffer(client.empty(4 * n)).with_scalar(np.uint32, [n])
        client.execute(TWICE, ac.CubeCount(-(-n // 256)), warm)  # compiled and loaded
        await client.sync()  # (a launch waiting on a compile could not be exported after)
        x = torch.arange(n, dtype=torch.float32, device="cuda")
        imported = client.from_dlpack(x)  # torch -> asynccube, a kernel, -> torch again
        twice = ac.Bindings().with_buffer(imported.handle).with_scalar(np.uint32, [n])
        client.execute(TWICE, ac.CubeCount(-(-n // 256)), twice)
        back = torch.from_dlpack(imported)  # torch's stream waits for the kernel
        expected = torch.arange(n, dtype=torch.float32, device="cuda") * 2
        round_trip = back.data_ptr() == x.data_ptr() and bool(torch.equal(back, expected))
        torch_import = per_call_us(lambda: client.from_dlpack(x), rounds=500)
        # The producer's part of that import: torch ordering its work before the
        # legacy default stream, what the import asks (nothing to do on torch's default
        # stream); beside it what it cost when asked for asynccube's own stream (an
        # event and a wait made through Python).
        ours = client.server.stream_handle(ac.StreamId.current())  # type: ignore[attr-defined]
        producer = per_call_us(lambda: x.__dlpack__(stream=1), rounds=500)
        producer_ours = per_call_us(lambda: x.__dlpack__(stream=ours), rounds=500)
        await client.sync()
    peer = torch.arange(n, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    to_cupy = per_call_us(lambda: cupy.from_dlpack(peer), rounds=500)
    cp_peer = cupy.arange(n, dtype=cupy.float32)
    to_torch = per_call_us(lambda: torch.utils.dlpack.from_dlpack(cp_peer), rounds=500)
    rows = [
        ["torch -> client.from_dlpack", f"{torch_import:.2f}",
         f"{to_cupy:.2f} (torch -> cupy.from_dlpack)", f"{torch_import / to_cupy:.2f}x",
         "yes (torch -> asynccube kernel -> torch, values checked)" if round_trip else "NO"],
        ["  of which torch's own `__dlpack__(stream=1)`",
         f"{producer:.2f}", "-", f"{producer / to_cupy:.2f}x of the peer", "-"],
        ["  (torch's `__dlpack__(stream=asynccube's stream)`, not asked)",
         f"{producer_ours:.2f}", "-", f"{producer_ours / to_cupy:.2f}x of the peer", "-"],
        ["asynccube -> torch.from_dlpack", f"{torch_dl:.2f}",
         f"{to_torch:.2f} (cupy -> torch.from_dlpack)", f"{torch_dl / to_torch:.2f}x",
         "yes" if td.data_ptr() == ptr else "NO"],
        ["asynccube -> cupy.from_dlpack", f"{cupy_dl:.2f}",
         f"{to_cupy:.2f} (torch -> cupy.from_dlpack)", f"{cupy_dl / to_cupy:.2f}x",
         "yes" if cd.data.ptr == ptr else "NO"],
        ["asynccube -> torch.as_tensor (CAI)", f"{torch_cai:.2f}",
         f"{to_torch:.2f} (cupy -> torch.from_dlpack)", f"{torch_cai / to_torch:.2f}x",
         "yes" if tt.data_ptr() == ptr else "NO"],
        ["asynccube -> cupy.asarray (CAI)", f"{cupy_cai:.2f}",
         f"{to_cupy:.2f} (torch -> cupy.from_dlpack)", f"{cupy_cai / to_cupy:.2f}x",
         "yes" if cc.data.ptr == ptr else "NO"],
    ]  # fmt: skip
    figures = {
        "torch_import_us": torch_import,
        "torch_producer_us": producer,
        "torch_producer_own_stream_us": producer_ours,
        "torch_round_trip_same_memory": round_trip,
        "torch_dlpack_us": torch_dl,
        "cupy_dlpack_us": cupy_dl,
        "torch_cai_us": torch_cai,
        "cupy_cai_us": cupy_cai,
        "torch_from_cupy_dlpack_us": to_torch,
        "cupy_from_torch_dlpack_us": to_cupy,
    }
    return rows, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="host")
    parser.add_argument("--n", type=int, default=100_000)
    args = parser.parse_args()
    header = ["exchange", "asynccube (µs)", "peer (µs)", "ratio", "same memory"]
    if args.device == "host":
        rows, figures = asyncio.run(host_rows(args.n))
        name, title = "interop", "Interop: DLPack on the host server"
    else:
        rows, figures = asyncio.run(gpu_rows(args.device, args.n))
        name, title = "interop_cuda", f"Interop: DLPack and CUDA Array Interface on {args.device}"
    command = f"`python benchmarks/bench_interop.py --device {args.device} --n {args.n}`"
    body = table(header, rows) + f"\n\nHost time per exchange, {args.n} float32. {command}"
    write(name, title, environment(args.device), body, figures)


if __name__ == "__main__":
    main()
