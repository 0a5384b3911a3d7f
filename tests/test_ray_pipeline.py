"""examples/ray_pipeline.py: the stage actors on a local Ray cluster (host servers), and
the same classes under the plain-asyncio driver."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ray_pipeline.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ray_pipeline", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ray_pipeline"] = module  # Ray pickles the actor classes by module name
    spec.loader.exec_module(module)
    return module


def test_plain_asyncio_driver_with_handles_and_numpy() -> None:
    rp = _example()
    items = rp.make_items(6, 4096)
    for handles in (True, False):
        out, rate = asyncio.run(rp.local_pipeline(["host", "host"], items, handles=handles))
        rp.check(items, out)
        assert rate > 0
    out, _ = asyncio.run(rp.local_pipeline(["host", "host"], items, handles=False, plain=True))
    rp.check(items, out)


def test_ray_actors_on_a_local_cluster() -> None:
    with warnings.catch_warnings():  # Ray's own import-time deprecation notices
        warnings.simplefilter("ignore")
        ray = pytest.importorskip(
            "ray", reason="Ray is not installed: pip install 'asynccube[ray]'"
        )
    rp = _example()
    items = rp.make_items(6, 4096)
    path = os.pathsep.join(p for p in (str(EXAMPLE.parent), os.environ.get("PYTHONPATH")) if p)
    env = {"env_vars": {"PYTHONPATH": path}}  # the workers import the example by name
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=env)
    try:
        out, rate = asyncio.run(rp.ray_pipeline(["host", "host"], items))
        rp.check(items, out)
        assert rate > 0
        out, _ = asyncio.run(rp.ray_pipeline(["host", "host"], items, plain=True))
        rp.check(items, out)
    finally:
        ray.shutdown()
