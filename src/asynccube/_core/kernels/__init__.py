"""Kernels written once: ``elementwise`` and ``reduction`` generate both parts of a
:class:`~asynccube.Kernel` (CUDA C++ for NVRTC, a chunked numpy function for the host
server) from one expression, typed by the dtypes bound at each call."""

from __future__ import annotations

from .binding import KernelLaunch
from .elementwise import ElementwiseKernel, KernelCall, elementwise
from .reduction import ReductionKernel, reduction

__all__ = [
    "ElementwiseKernel",
    "KernelCall",
    "KernelLaunch",
    "ReductionKernel",
    "elementwise",
    "reduction",
]
