"""asynccube: an async GPU compute runtime for Python.

A port of cubecl-runtime onto NVIDIA's cuda-python driver API with a channel native to
asyncio: one actor task owns the device server; ``read`` and ``sync`` return awaitables;
concurrent tasks run on concurrent streams. Without a GPU the same API runs on a numpy
host server.

    import asynccube as ac

    async with ac.open_client() as client:
        h = client.create(b"...")
        data = await client.read([h.binding()])
"""

from __future__ import annotations

from ._core.client.client import ComputeClient
from ._core.client.graph import Graph
from ._core.client.tensor import Tensor
from ._core.errors import (
    AsyncCubeError,
    AutotuneCheckError,
    AutotuneError,
    BufferTooBig,
    ClientClosedError,
    ClientDeadError,
    CompilationError,
    ConfigError,
    DeviceError,
    DLPackError,
    ExclusiveAccessError,
    ExclusiveCallError,
    ExecutionError,
    GraphCaptureError,
    GraphUpdateError,
    InvalidArgument,
    InvalidHandle,
    IoError,
    KernelNotSupported,
    LoopMismatchError,
    OutOfMemory,
    ProfileError,
    ScalarTypeError,
    TaintedBuffer,
    Unknown,
    UnsupportedBackend,
    UnsupportedIoOperation,
    UnsupportedStrides,
)
from ._core.host.server import HostServer
from ._core.memory import MemoryReport, PoolReport
from ._core.profiling.records import KernelRecord, ProfileStats, ProfileSummary
from ._core.profiling.timeline import Timeline
from ._core.runtime.open import connect, open_client
from ._core.server.protocol import BindingResource, Completion, ComputeServer, DeviceProperties
from ._core.tune import (
    AutotuneKey,
    AutotuneOutcome,
    CheckMismatch,
    CheckReport,
    Tunable,
    TunableSet,
    TuneCache,
    TuneChecks,
    TuneMode,
    Tuner,
    TuneResult,
    anchor,
)
from ._core.values.bindings import (
    SCALAR_DTYPES,
    Bindings,
    CubeCount,
    Im2colFormat,
    MetadataBinding,
    OobFill,
    ScalarBinding,
    TensorMapBinding,
    TensorMapInterleave,
    TensorMapMeta,
    TensorMapPrefetch,
    TensorMapSwizzle,
    TiledFormat,
)
from ._core.values.kernel import CudaSource, HostLaunch, Kernel
from ._core.values.stream_id import StreamId
from ._core.values.types import (
    Allocation,
    AllocationDescriptor,
    AllocationKind,
    Binding,
    CopyDescriptor,
    ExecutionMode,
    Handle,
    MemoryAllocationMode,
    MemoryUsage,
    ProfileDuration,
    ProfilingToken,
    TimingMethod,
)
from ._core.version import __version__

__all__ = [
    "SCALAR_DTYPES",
    "Allocation",
    "AllocationDescriptor",
    "AllocationKind",
    "AsyncCubeError",
    "AutotuneCheckError",
    "AutotuneError",
    "AutotuneKey",
    "AutotuneOutcome",
    "Binding",
    "BindingResource",
    "Bindings",
    "BufferTooBig",
    "CheckMismatch",
    "CheckReport",
    "ClientClosedError",
    "ClientDeadError",
    "CompilationError",
    "Completion",
    "ComputeClient",
    "ComputeServer",
    "ConfigError",
    "CopyDescriptor",
    "CubeCount",
    "CudaSource",
    "DeviceError",
    "DLPackError",
    "DeviceProperties",
    "ExclusiveAccessError",
    "ExclusiveCallError",
    "ExecutionError",
    "ExecutionMode",
    "Graph",
    "GraphCaptureError",
    "GraphUpdateError",
    "Handle",
    "HostLaunch",
    "HostServer",
    "Im2colFormat",
    "InvalidArgument",
    "InvalidHandle",
    "IoError",
    "Kernel",
    "KernelNotSupported",
    "KernelRecord",
    "LoopMismatchError",
    "MemoryAllocationMode",
    "MemoryReport",
    "MemoryUsage",
    "MetadataBinding",
    "OobFill",
    "OutOfMemory",
    "PoolReport",
    "ProfileDuration",
    "ProfileError",
    "ProfileStats",
    "ProfileSummary",
    "ProfilingToken",
    "ScalarBinding",
    "ScalarTypeError",
    "StreamId",
    "Tensor",
    "TensorMapBinding",
    "TensorMapInterleave",
    "TensorMapMeta",
    "TensorMapPrefetch",
    "TensorMapSwizzle",
    "TiledFormat",
    "Timeline",
    "TimingMethod",
    "Tunable",
    "TunableSet",
    "TuneCache",
    "TuneChecks",
    "TuneMode",
    "TuneResult",
    "Tuner",
    "TaintedBuffer",
    "Unknown",
    "UnsupportedBackend",
    "UnsupportedIoOperation",
    "UnsupportedStrides",
    "__version__",
    "anchor",
    "connect",
    "open_client",
]
