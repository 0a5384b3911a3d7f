"""Where the host time of a DLPack exchange with torch goes (diagnostic, GPU only):
``client.from_dlpack(torch_tensor)`` and ``torch.from_dlpack(tensor)``, each run 20000
times under cProfile, the top functions by own time printed (and written to
``$OUT/profile-interop-*.txt`` when ``$OUT`` is set).

    python benchmarks/profile_interop.py [--device cuda:0] [--rounds 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
from pathlib import Path
from typing import Any

import numpy as np

import asynccube as ac


def _profile(name: str, fn: Any, rounds: int) -> None:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(rounds):
        fn()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
    print(f"== {name}\n{text.getvalue()}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"profile-interop-{name}.txt").write_text(text.getvalue())


async def main(device: str, rounds: int) -> None:
    import torch

    async with ac.open_client(device) as client:
        x = torch.arange(100_000, dtype=torch.float32, device="cuda")
        t = client.create_array(np.arange(100_000, dtype=np.float32))
        await client.sync()
        _profile("import", lambda: client.from_dlpack(x), rounds)
        await client.sync()
        _profile("export", lambda: torch.from_dlpack(t), rounds)
        await client.sync()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--rounds", type=int, default=20000)
    a = p.parse_args()
    asyncio.run(main(a.device, a.rounds))
