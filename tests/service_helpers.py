"""What the example services' tests share (aiohttp's ``gpu_service.py``, the FastAPI
and Starlette ``fastapi_service.py``): loading an example as a module, the request
bodies and their expected answers, a chunked body."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OCTETS = {"Content-Type": "application/octet-stream"}


def load_example(name: str) -> ModuleType:
    """``examples/<name>.py`` imported as the module ``name``."""
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def values(seed: int, n: int) -> np.ndarray:
    """``n`` float32 request values."""
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def y(x: np.ndarray) -> bytes:
    """The answer to ``x``: ``2x + 1``, as bytes."""
    return (x * np.float32(2) + np.float32(1)).tobytes()


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    """A body sent chunked (no Content-Length)."""
    for part in parts:
        yield part
