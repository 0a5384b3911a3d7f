"""``ac.reduction``: sum, product, min or max of an expression, over a whole tensor or
one axis of a 2-D tensor, for every server.

A whole-tensor reduction runs in two launches over a partials buffer. Called (not
bound) on a CUDA client, each stream keeps one partials buffer (in the client's
``scratch``; the last four streams that called one, ``memory_cleanup()`` gives them
back) for every reduction it runs: the launches are stream-ordered, so reusing it is safe,
and a call then allocates nothing and both launches take the one-call route (issue 38:
a fresh buffer per call was allocated through the actor while the last call's was still
in use, which queued the launches behind it)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ..client.client import ComputeClient
from ..client.tensor import Tensor
from ..errors import InvalidArgument, KernelDefinitionError
from ..values.bindings import Bindings, CubeCount, MetadataBinding
from ..values.kernel import CudaSource, Kernel
from ..values.stream_id import StreamId
from .binding import (
    CallArgs,
    KernelLaunch,
    ScalarGroups,
    check_scalar_ranges,
    count_metadata,
    cube_count,
    new_bindings,
    read_args,
    remember,
    scalar_bindings,
    scalar_groups,
)
from .cuda_gen import BLOCK, OPTIONS, KernelParts, abi_scalars, tile_elements
from .cuda_reduce import axis_source, finish_source, partial_source
from .dtypes import SUPPORTED, Ty, c_storage, strong
from .elementwise import WIDE, KernelCall, grid_blocks
from .expr import parse_expression
from .reduce_host import axis_host, finish_host, partial_host
from .typing import TypeContext, Typed, type_node

__all__ = ["ReductionKernel", "reduction"]

OPS: Final = {"sum": "add", "prod": "multiply", "min": "minimum", "max": "maximum"}
MAX_PARTIALS: Final = 1024
PER_THREAD: Final = 16
"""Elements each thread of the whole-tensor pass folds per tile (whole vectors)."""
_RESERVED: Final = frozenset({"axis", "out"})


@dataclass(frozen=True, slots=True)
class _Spec:
    kernels: tuple[Kernel, ...]
    arrays: tuple[str, ...]
    groups: ScalarGroups
    ctx: TypeContext
    acc: np.dtype[Any]
    out: np.dtype[Any]
    per_thread: int


class ReductionKernel:
    """A reduction of a mapped expression, for every server (made by :func:`reduction`).

    ``kernel(client, axis=None, out=None, **arguments)`` queues it on the calling task's
    stream and returns the result tensor: shape ``()`` over the whole tensor, or the
    other axis's length for ``axis=0``/``1`` of a 2-D tensor. :meth:`bind` gives the
    launches for ``client.execute`` instead.

    Attributes:
        op: ``"sum"``, ``"prod"``, ``"min"`` or ``"max"``.
        map: The expression reduced (``"x"`` by default).
        inputs: The arguments it reads, in order of first use.
        name: The name in the kernels' ids.
    """

    def __init__(self, op: str, map: str = "x", *, name: str = "reduction") -> None:
        if not isinstance(op, str) or op not in OPS:
            raise KernelDefinitionError(f"reduction op must be one of {list(OPS)}, got {op!r}")
        if not isinstance(name, str) or not name.isidentifier():
            raise KernelDefinitionError(f"name= must be an identifier, got {name!r}")
        self.op, self.map, self.name = op, map, name
        self.node, self.inputs = parse_expression(map)
        if _RESERVED & set(self.inputs):
            raise KernelDefinitionError(f"in {map!r}: 'axis' and 'out' name the call's options")
        self._specs: dict[tuple[Any, ...], _Spec] = {}
        self._what = f"{name} ({op} of {map!r})"

    def __repr__(self) -> str:
        return f"ReductionKernel({self.op!r}, {self.map!r}, name={self.name!r})"

    def __call__(
        self,
        client: ComputeClient,
        /,
        axis: int | None = None,
        out: Tensor | None = None,
        **arguments: Any,
    ) -> Tensor:
        """Queue the reduction over ``arguments`` and return its result tensor."""
        launches, result = self._bind(client, axis, out, arguments, True)
        execute = client.execute
        for launch in launches:
            execute(*launch)
        return result

    def bind(
        self,
        client: ComputeClient,
        /,
        axis: int | None = None,
        out: Tensor | None = None,
        **arguments: Any,
    ) -> KernelCall:
        """The launches for ``arguments`` (``out`` allocated if not given; a whole-tensor
        reduction also allocates its partials)."""
        launches, result = self._bind(client, axis, out, arguments, False)
        return KernelCall(launches, {"out": result})

    def _bind(
        self,
        client: ComputeClient,
        axis: int | None,
        out: Tensor | None,
        arguments: dict[str, Any],
        now: bool,
    ) -> tuple[tuple[KernelLaunch, ...], Tensor]:
        """:meth:`bind`'s launches and result; ``now``: the caller executes them at
        once, on its stream (their partials may be the stream's kept buffer)."""
        what = self._what
        args = read_args(what, client, self.inputs, (), arguments)
        if args.shape is None:
            raise InvalidArgument(f"{what}: give at least one Tensor (an array argument)")
        axis, out_shape = _axis(what, axis, args.shape)
        spec = self._spec(args, axis, out)
        if spec.ctx.int_targets:
            check_scalar_ranges(spec.ctx, args.scalars)
        if args.size == 0 and self.op in ("min", "max") and out_shape != (0,):
            raise InvalidArgument(
                f"{what}: {self.op} of an empty tensor has no value (no identity)"
            )
        result = out if out is not None else client.empty_array(out_shape, spec.out)
        _check_out(what, result, out_shape, client)
        base = new_bindings([args.tensors[a].handle.binding() for a in spec.arrays])
        if spec.groups:
            scalar_bindings(base, spec.groups, args.scalars)
        if axis is None:
            launches = self._whole(client, spec, args, base, result, now)
        else:
            rows, cols = args.shape
            base.buffers.append(result.handle.binding())
            base.metadata = count_metadata(rows, cols)
            blocks = min(rows, 65535) if axis == 1 else grid_blocks(cols)
            launches = (KernelLaunch(spec.kernels[0], cube_count(max(1, blocks)), base),)
        return launches, result

    def _whole(
        self,
        client: ComputeClient,
        spec: _Spec,
        args: CallArgs,
        base: Bindings,
        result: Tensor,
        now: bool,
    ) -> tuple[KernelLaunch, ...]:
        grid = _GRIDS.get((args.size, spec.per_thread))
        if grid is None:
            grid = _grid(args.size, spec.per_thread)
        groups, meta, cubes, finish_meta = grid
        partials = _kept_partials(client) if now else None
        if partials is None:
            partials = client.empty(groups * spec.acc.itemsize).binding()
        base.buffers.append(partials)
        base.metadata = meta
        finish = new_bindings([partials, result.handle.binding()])
        finish.metadata = finish_meta
        return (
            KernelLaunch(spec.kernels[0], cubes, base),
            KernelLaunch(spec.kernels[1], _ONE, finish),
        )

    def _spec(self, args: CallArgs, axis: int | None, out: Tensor | None) -> _Spec:
        wide = args.size >= WIDE
        tensors, given = args.tensors, args.types
        types = tuple([(n, n in tensors, given[n]) for n in self.inputs])
        key = (types, axis, None if out is None else out.dtype, wide)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = self._make_spec(args, axis, out, wide)
        return spec

    def _make_spec(self, args: CallArgs, axis: int | None, out: Tensor | None, wide: bool) -> _Spec:
        arrays = tuple(n for n in self.inputs if n in args.tensors)
        ctx = TypeContext(self.map, dict(args.types), frozenset(args.tensors))
        mapped = type_node(self.node, ctx)
        op = OPS[self.op]
        result = _result_dtype(op, mapped.dtype)
        acc = np.dtype(np.float32) if result == np.float16 else result
        out_dt = out.dtype if out is not None else result
        scalars = tuple(abi_scalars([(n, args.types[n]) for n in self.inputs if n not in arrays]))
        in_dtypes = tuple((n, strong(args.types[n])) for n in arrays)
        kernels = self._kernels(op, mapped, in_dtypes, scalars, acc, out_dt, axis, wide)
        width, unroll = tile_elements([dt for _, dt in in_dtypes], PER_THREAD)
        return _Spec(kernels, arrays, scalar_groups(scalars), ctx, acc, out_dt, width * unroll)

    def _kernels(
        self,
        op: str,
        mapped: Typed,
        arrays: tuple[tuple[str, np.dtype[Any]], ...],
        scalars: tuple[tuple[str, Ty], ...],
        acc: np.dtype[Any],
        out: np.dtype[Any],
        axis: int | None,
        wide: bool,
    ) -> tuple[Kernel, ...]:
        host_args = (mapped, arrays, scalars, op, acc)
        if axis is not None:
            parts = KernelParts(arrays, (f"{c_storage(out)}* r0",), scalars, 4)
            source = axis_source(parts, mapped, op, acc, out, axis, wide)
            host = axis_host(*host_args, out, axis)
            return (self._kernel("ac_reduce_axis", source, host),)
        parts = KernelParts(arrays, (f"{c_storage(acc)}* r0",), scalars, 2)
        first = self._kernel(
            "ac_reduce_partial",
            partial_source(parts, mapped, op, acc, wide, PER_THREAD),
            partial_host(*host_args),
        )
        second = self._kernel(
            "ac_reduce_finish", finish_source(op, acc, out), finish_host(op, acc, out)
        )
        return first, second

    def _kernel(self, entry: str, source: str, host: Any) -> Kernel:
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        return Kernel(
            f"{self.name}_{digest}",
            cuda=CudaSource(source, entry, block=(BLOCK, 1, 1), options=OPTIONS),
            host=host,
        )


def _result_dtype(op: str, dt: np.dtype[Any]) -> np.dtype[Any]:
    """numpy's: a sum or product of a narrower integer is int64 (uint64 if unsigned)."""
    if op in ("add", "multiply"):
        out: np.dtype[Any] = getattr(np, op).reduce(np.zeros(1, dt)).dtype
        return out
    return dt


def _axis(
    what: str, axis: int | None, shape: tuple[int, ...]
) -> tuple[int | None, tuple[int, ...]]:
    if axis is None:
        return None, ()
    if len(shape) != 2 or not isinstance(axis, int) or axis not in (0, 1, -1, -2):
        raise InvalidArgument(
            f"{what}: axis={axis!r} needs a 2-D tensor and 0, 1, -1 or -2 (got shape {shape}); "
            "axis=None reduces the whole tensor"
        )
    axis %= 2
    return axis, (shape[1 - axis],)


def _check_out(what: str, out: Tensor, shape: tuple[int, ...], client: ComputeClient) -> None:
    if not isinstance(out, Tensor) or out.shape != shape:
        got = out.shape if isinstance(out, Tensor) else type(out).__name__
        raise InvalidArgument(f"{what}: out must be a Tensor of shape {shape}, got {got}")
    owner = out._client() if out._client is not None else None
    if owner is not client or out.dtype not in SUPPORTED or out.strides != _CONTIGUOUS[len(shape)]:
        read_args(what, client, (), ("out",), {"out": out})  # raises, naming what is wrong


_CONTIGUOUS: Final = {0: (), 1: (1,)}
"""The strides of a contiguous result: shape ``()`` or ``(n,)``."""


def _groups_metadata(groups: int) -> MetadataBinding:
    """The finishing pass's metadata (the partials' count), one per count, read-only."""
    meta = _FINISH.get(groups)
    if meta is None:
        meta = _FINISH[groups] = MetadataBinding(np.array([groups], np.uint32))
        meta.data.flags.writeable = False
    return meta


_FINISH: dict[int, MetadataBinding] = {}
_ONE: Final = cube_count(1)
_GRIDS: dict[tuple[int, int], tuple[int, MetadataBinding, CubeCount, MetadataBinding]] = {}
"""A whole-tensor pass's grid by (elements, elements a thread folds per tile): the
partials' count, the first pass's metadata and cube count, the finishing pass's
metadata (each shared, read-only)."""


def _grid(size: int, per_thread: int) -> tuple[int, MetadataBinding, CubeCount, MetadataBinding]:
    """The entry of :data:`_GRIDS` for ``size`` and ``per_thread`` (made, kept)."""
    groups = max(1, min(MAX_PARTIALS, -(-size // (BLOCK * per_thread))))
    grid = (groups, count_metadata(size), cube_count(groups), _groups_metadata(groups))
    return remember(_GRIDS, (size, per_thread), grid)


_PARTIALS_BYTES: Final = MAX_PARTIALS * 8
"""A kept partials buffer's size: the most partials of the widest accumulator."""
_STREAMS_KEPT: Final = 4
"""Streams whose partials buffer a client keeps (the oldest is dropped past that): a
service running a task per request gets a new stream per request, whose buffer would
otherwise stay (32 KiB at most, and ``memory_cleanup()`` gives them back)."""

_SCRATCH_KEY: Final = "kernels.reduction.partials"
"""The key of the kept partials in the client's ``scratch``: ``{stream id: (Handle,
Binding)}``, oldest first."""


def _kept_partials(client: ComputeClient) -> Any:
    """The calling stream's partials buffer (a Binding) for a call whose launches run at
    once, or None: then the call allocates its own, as before.

    Kept only on a server whose failures are known as a command is issued (CUDA: it has
    a one-call route), with nothing queued, no failure held and no capture or exclusive
    block open: then the buffer carries no failure from an earlier call (a skipped or
    failed launch taints its buffers: with one held, calls allocate their own until it
    is gone; the stream's kept buffer, if it carries it, is dropped, so that its
    failure goes with it) and no graph keeps it."""
    channel = client._channel
    if client._fast is None or not channel.quiet():
        return None
    scratch = client._memory.scratch
    by_stream = scratch.get(_SCRATCH_KEY)
    if by_stream is None:
        by_stream = scratch[_SCRATCH_KEY] = {}
    sid = StreamId.current().value
    pair = by_stream.get(sid)
    tainted = channel.tainted_ids()
    if tainted:
        if pair is not None and pair[1].memory.id in tainted:
            del by_stream[sid]
        return None
    if pair is None:
        if len(by_stream) >= _STREAMS_KEPT:
            del by_stream[next(iter(by_stream))]
        handle = client.empty(_PARTIALS_BYTES)
        pair = by_stream[sid] = (handle, handle.binding())
    return pair[1]


def reduction(op: str, map: str = "x", *, name: str = "reduction") -> ReductionKernel:
    """A reduction kernel for the CUDA and the host server: ``op`` (``"sum"``,
    ``"prod"``, ``"min"`` or ``"max"``) of ``map``, an expression over named arguments
    as in :func:`elementwise` (``"x"``: the tensor itself; ``"x * y"``: a dot product).

    The result's dtype is numpy's (``sum`` of an int32 tensor is int64; a float16 sum
    accumulates in float32). Called with ``axis=None`` it reduces every element;
    ``axis=0`` or ``1`` reduces one axis of a 2-D tensor.

    Raises:
        KernelDefinitionError: An unknown op, or a map expression that does not parse.
    """
    return ReductionKernel(op, map, name=name)
