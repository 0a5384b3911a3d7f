"""Copy plans for strided tensors (pure arithmetic, no GPU): simulated against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from asynccube._core.cuda.copies import plan_copy


def simulate(shape: tuple[int, ...], strides: tuple[int, ...], elem: int, dev: bytes) -> bytes:
    plan = plan_copy(shape, strides, elem)
    host = bytearray(int(np.prod(shape)) * elem)
    for d, h in plan.copies():
        for r in range(plan.height):
            src = d + r * plan.pitch
            host[h + r * plan.width : h + (r + 1) * plan.width] = dev[src : src + plan.width]
    return bytes(host)


def reference(shape: tuple[int, ...], strides: tuple[int, ...], elem: int, dev: bytes) -> bytes:
    a = np.frombuffer(dev, np.uint8)
    byte_strides = (*(s * elem for s in strides), 1)
    view = np.lib.stride_tricks.as_strided(a, shape=(*shape, elem), strides=byte_strides)
    return np.ascontiguousarray(view).tobytes()


CASES = [
    ((3, 4), (4, 1), 4, 1, 1),  # contiguous: one 1D copy
    ((3, 4), (8, 1), 4, 3, 1),  # pitched rows: one 2D copy
    ((4, 3), (1, 8), 4, 3, 4),  # transposed: one 2D copy per row of the result
    ((2, 3, 5), (40, 8, 1), 2, 3, 2),
    ((2, 3, 5), (24, 8, 1), 2, 6, 1),  # pitched 3D: outer dim merged into the rows
    ((5,), (3,), 4, 5, 1),
    ((2, 1, 3), (6, 6, 1), 4, 2, 1),
    ((3, 2, 2), (1, 3, 6), 4, 2, 6),
    ((2, 3, 4), (24, 8, 2), 4, 24, 1),
]


@pytest.mark.parametrize(("shape", "strides", "elem", "height", "copies"), CASES)
def test_plan_matches_numpy(
    shape: tuple[int, ...], strides: tuple[int, ...], elem: int, height: int, copies: int
) -> None:
    plan = plan_copy(shape, strides, elem)
    span = (sum((d - 1) * s for d, s in zip(shape, strides, strict=True)) + 1) * elem
    dev = np.random.default_rng(7).integers(0, 256, span + 16, dtype=np.uint8).tobytes()
    assert simulate(shape, strides, elem, dev) == reference(shape, strides, elem, dev)
    assert (plan.height, len(plan.outer), plan.span) == (height, copies, span)


def test_empty_tensor_copies_nothing() -> None:
    assert plan_copy((0, 3), (3, 1), 4).outer == ()
