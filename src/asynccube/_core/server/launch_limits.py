"""Launch limits, checked the same way by every server in ``ExecutionMode.CHECKED``.

The CUDA server takes the limits from the device's properties; the host server uses
CUDA's documented limits (every architecture asynccube supports), so a launch that
passes on a laptop is not refused by a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ..errors import InvalidArgument
from ..values.kernel import CudaSource, block_size

__all__ = ["HOST_LIMITS", "LaunchLimits", "block_problem", "check_launch", "grid_problem"]


@dataclass(frozen=True, slots=True)
class LaunchLimits:
    """What one launch may ask for.

    Attributes:
        max_grid: The most cubes (blocks) along x, y, z.
        max_block: The most threads per cube along x, y, z.
        max_threads: The most threads per cube in all.
        max_shared_memory: The most dynamic shared memory per cube, in bytes.
    """

    max_grid: tuple[int, int, int]
    max_block: tuple[int, int, int]
    max_threads: int
    max_shared_memory: int


HOST_LIMITS: Final = LaunchLimits(
    max_grid=(2**31 - 1, 65535, 65535),
    max_block=(1024, 1024, 64),
    max_threads=1024,
    max_shared_memory=227 * 1024,
)
"""CUDA's documented limits (CUDA C++ Programming Guide, "Technical Specifications per
Compute Capability"): grid x < 2**31, grid y and z <= 65535, 1024 threads per block in
(1024, 1024, 64), and at most 227 KiB of (opt-in) shared memory per block."""


def grid_problem(grid: tuple[int, int, int], max_grid: tuple[int, int, int]) -> str:
    """What is wrong with a cube count (``""`` if nothing)."""
    if 0 in grid:
        return (
            f"cube count {grid} has a zero dimension, which a GPU refuses to launch; skip "
            "the launch, or use ExecutionMode.UNCHECKED to skip it silently"
        )
    for axis, n, limit in zip("xyz", grid, max_grid, strict=True):
        if n > limit:
            return (
                f"cube count (grid) {grid} exceeds the device's limit {max_grid} along {axis}; "
                "launch fewer cubes (more threads per cube, or a loop in the kernel)"
            )
    return ""


def block_problem(source: CudaSource, limits: LaunchLimits) -> str:
    """What is wrong with a kernel's block and shared memory (``""`` if nothing)."""
    limit, dims = limits.max_threads, limits.max_block
    if block_size(source.block) > limit or any(
        b > m for b, m in zip(source.block, dims, strict=True)
    ):
        return f"block {source.block} exceeds the limits ({limit} threads, dims {dims})"
    smem = limits.max_shared_memory
    if source.shared_mem_bytes > smem:
        return f"{source.shared_mem_bytes} bytes of dynamic shared memory exceed {smem}"
    return ""


def check_launch(
    kernel_id: str,
    device: str,
    grid: tuple[int, int, int],
    limits: LaunchLimits,
    source: CudaSource | None = None,
) -> None:
    """Raise InvalidArgument naming the kernel and the device if the launch (its cube
    count, and its block and shared memory when ``source`` is given) breaks ``limits``."""
    problem = grid_problem(grid, limits.max_grid)
    if not problem and source is not None:
        problem = block_problem(source, limits)
    if problem:
        raise InvalidArgument(f"kernel {kernel_id!r} on {device}: {problem}")
