"""``ac.elementwise``: a kernel from one expression, for every server."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from ..client.client import ComputeClient
from ..client.tensor import Tensor
from ..errors import InvalidArgument, KernelDefinitionError
from ..values.kernel import CudaSource, HostLaunch, Kernel
from .binding import (
    CallArgs,
    KernelLaunch,
    ScalarGroups,
    check_scalar_ranges,
    count_metadata,
    cube_count,
    new_bindings,
    read_args,
    scalar_bindings,
    scalar_groups,
)
from .cuda_gen import (
    BLOCK,
    OPTIONS,
    KernelParts,
    abi_scalars,
    elementwise_source,
    tile_elements,
)
from .dtypes import Ty, c_storage, strong
from .expr import Program, parse_program
from .host_eval import CHUNK, ChunkEval, fold
from .typing import TypeContext, Typed, type_node

__all__ = ["ElementwiseKernel", "KernelCall", "elementwise", "grid_blocks", "host_scalars"]

MAX_BLOCKS: Final = 1 << 20
WIDE: Final = 1 << 31
PER_THREAD: Final = 8
"""Elements each thread of an elementwise kernel handles per tile (whole vectors)."""


def grid_blocks(n: int, per_thread: int = 1) -> int:
    """Blocks of a grid-stride loop over ``n`` elements (at least one)."""
    return max(1, min(MAX_BLOCKS, -(-n // (BLOCK * per_thread))))


@dataclass(frozen=True, slots=True)
class KernelCall:
    """A call bound to its tensors: the launches to run, in order, and the outputs.

    ``for launch in call.launches: client.execute(*launch)`` runs it through
    ``client.execute`` (what calling the kernel does); ``call.result`` is what calling
    it returns.
    """

    launches: tuple[KernelLaunch, ...]
    outputs: dict[str, Tensor]

    @property
    def result(self) -> Any:
        """The output tensor, or a tuple of them (in assignment order) if several."""
        values = tuple(self.outputs.values())
        return values[0] if len(values) == 1 else values


@dataclass(frozen=True, slots=True)
class _Spec:
    """One dtype signature's kernel and how to bind it."""

    kernel: Kernel
    arrays: tuple[str, ...]
    groups: ScalarGroups
    ctx: TypeContext
    out_dtypes: tuple[np.dtype[Any], ...]
    per_thread: int


class ElementwiseKernel:
    """An elementwise kernel from assignments over named arguments, for every server.

    Made by :func:`elementwise`. Calling it, ``kernel(client, **arguments)``, queues it
    on the calling task's stream and returns its output tensor(s); :meth:`bind` gives
    the launches for ``client.execute`` instead.

    Attributes:
        name: The name in the kernels' ids (their compile-cache keys).
        expression: The expression it was made from.
        inputs: The arguments it reads, in order of first use.
        outputs: The names it assigns, in order.
    """

    def __init__(self, expression: str, *, name: str = "elementwise") -> None:
        self.program: Program = parse_program(expression)
        self.expression = expression
        self.name = _checked_name(name)
        self.inputs = self.program.inputs
        self.outputs = self.program.outputs
        self._specs: dict[tuple[Any, ...], _Spec] = {}
        self._what = f"{self.name} ({self.expression!r})"

    def __repr__(self) -> str:
        return f"ElementwiseKernel({self.expression!r}, name={self.name!r})"

    def __call__(self, client: ComputeClient, /, **arguments: Any) -> Any:
        """Queue the kernel over ``arguments`` (tensors and numbers by name; outputs may
        be given, else they are allocated) and return the output tensor(s)."""
        call = self.bind(client, **arguments)
        for launch in call.launches:
            client.execute(*launch)
        return call.result

    def bind(self, client: ComputeClient, /, **arguments: Any) -> KernelCall:
        """The launch for ``arguments`` (outputs not given are allocated on ``client``)."""
        what = self._what
        args = read_args(what, client, self.inputs, self.outputs, arguments)
        if args.shape is None:
            raise InvalidArgument(f"{what}: give at least one Tensor (an array argument)")
        spec = self._spec(args)
        if spec.ctx.int_targets:
            check_scalar_ranges(spec.ctx, args.scalars)
        tensors = args.tensors
        outputs = {}
        for name, dt in zip(self.outputs, spec.out_dtypes, strict=True):
            given = tensors.get(name)
            outputs[name] = given if given is not None else client.empty_array(args.shape, dt)
        buffers = [tensors[a].handle.binding() for a in spec.arrays]
        buffers += [t.handle.binding() for t in outputs.values()]
        bindings = new_bindings(buffers)
        if spec.groups:
            scalar_bindings(bindings, spec.groups, args.scalars)
        bindings.metadata = count_metadata(args.size)
        cubes = cube_count(grid_blocks(args.size, spec.per_thread))
        return KernelCall((KernelLaunch(spec.kernel, cubes, bindings),), outputs)

    def _spec(self, args: CallArgs) -> _Spec:
        tensors, types = args.tensors, args.types
        given = tuple(tensors[o].dtype if o in tensors else None for o in self.outputs)
        wide = args.size >= WIDE
        key = (tuple([(n, n in tensors, types[n]) for n in self.inputs]), given, wide)
        spec = self._specs.get(key)
        if spec is None:
            spec = self._specs[key] = self._make_spec(args, given, wide)
        return spec

    def _make_spec(
        self, args: CallArgs, given: tuple[np.dtype[Any] | None, ...], wide: bool
    ) -> _Spec:
        arrays = tuple(n for n in self.inputs if n in args.tensors)
        ctx = TypeContext(self.expression, dict(args.types), frozenset(args.tensors))
        statements, out_dtypes = _type_statements(self.program, ctx, given)
        scalars = tuple(abi_scalars([(n, args.types[n]) for n in self.inputs if n not in arrays]))
        parts = KernelParts(
            tuple((n, strong(args.types[n])) for n in arrays),
            tuple(f"{c_storage(dt)}* q{j}" for j, dt in enumerate(out_dtypes)),
            scalars,
            2,
        )
        source = elementwise_source(parts, statements, out_dtypes, wide, PER_THREAD)
        width, unroll = tile_elements([*(dt for _, dt in parts.arrays), *out_dtypes], PER_THREAD)
        digest = hashlib.sha256(source.encode()).hexdigest()[:16]
        host = _host_function(statements, arrays, self.outputs, out_dtypes, args.types, scalars)
        kernel = Kernel(
            f"{self.name}_{digest}",
            cuda=CudaSource(source, "ac_elementwise", block=(BLOCK, 1, 1), options=OPTIONS),
            host=host,
        )
        return _Spec(kernel, arrays, scalar_groups(scalars), ctx, out_dtypes, width * unroll)


def _checked_name(name: str) -> str:
    if not isinstance(name, str) or not name.isidentifier():
        raise KernelDefinitionError(f"name= must be an identifier, got {name!r}")
    return name


def _type_statements(
    program: Program, ctx: TypeContext, given: tuple[np.dtype[Any] | None, ...]
) -> tuple[list[tuple[str, Typed]], tuple[np.dtype[Any], ...]]:
    statements, dtypes = [], []
    types = dict(ctx.types)
    ctx.types = types
    ctx.arrays = ctx.arrays | frozenset(program.outputs)
    for (target, node), dt in zip(program.statements, given, strict=True):
        typed = type_node(node, ctx)
        out = dt if dt is not None else strong(typed.ty)
        statements.append((target, typed))
        dtypes.append(out)
        types[target] = out  # a later statement reads the output, in its dtype
    return statements, tuple(dtypes)


def host_scalars(launch: HostLaunch, scalars: tuple[tuple[str, Ty], ...]) -> dict[str, Any]:
    """Each scalar argument's value from a host launch, typed as at the call (a weak
    Python int/float again, a bool, or a numpy scalar)."""
    index: dict[Any, int] = {}
    out: dict[str, Any] = {}
    for name, ty in scalars:
        dt = strong(ty)
        pdt = np.dtype(np.uint8) if dt == np.bool_ else dt
        i = index[pdt] = index.get(pdt, -1) + 1
        raw = launch.scalar(pdt, i)
        out[name] = ty(raw.item()) if not isinstance(ty, np.dtype) else dt.type(raw)
    return out


def launch_count(launch: HostLaunch, word: int = 0) -> int:
    """The element count in metadata words ``word`` and ``word + 1``."""
    return int(launch.metadata[word]) | (int(launch.metadata[word + 1]) << 32)


def _host_function(
    statements: list[tuple[str, Typed]],
    arrays: tuple[str, ...],
    outputs: tuple[str, ...],
    out_dtypes: tuple[np.dtype[Any], ...],
    types: dict[str, Ty],
    scalars: tuple[tuple[str, Ty], ...],
) -> Any:
    dtypes = [strong(types[a]) for a in arrays] + list(out_dtypes)
    names = list(arrays) + list(outputs)

    def run(launch: HostLaunch) -> None:
        n = launch_count(launch)
        views = {
            name: buf[: n * dt.itemsize].view(dt)
            for name, buf, dt in zip(names, launch.buffers, dtypes, strict=True)
        }
        folded: dict[int, Any] = {}
        values = host_scalars(launch, scalars)
        for _, typed in statements:
            fold(typed, values, folded)
        chunks = ChunkEval(views, folded)
        with np.errstate(all="ignore"):
            for lo in range(0, n, CHUNK):
                chunks.lo, chunks.hi = lo, min(n, lo + CHUNK)
                for target, typed in statements:
                    chunks.into(typed, views[target][lo : chunks.hi])

    return run


def elementwise(expression: str, *, name: str = "elementwise") -> ElementwiseKernel:
    """An elementwise kernel from ``expression``, for the CUDA and the host server.

    ``expression`` is one or more assignments (``"y = a * x + b"``; several separated
    by ``;`` or new lines, a later one may read an earlier output) in Python syntax:
    arithmetic, comparisons, ``and``/``or``/``not``, ``a if c else b`` and
    ``where(c, a, b)``, the common math functions and casts (``float32(x)``). Each
    name read is an argument: a :class:`~asynccube.Tensor` (an array argument; all of
    one shape) or a number (a scalar, broadcast). Types follow numpy's rules for the
    bound dtypes (a Python float is weak: ``2.0 * x`` keeps float32). Outputs not given
    are allocated with the expression's dtype; a given one receives the value cast to
    its dtype. A kernel is generated and compiled once per dtype signature.

    Raises:
        KernelDefinitionError: The expression does not parse, or names an unknown
            function or operator (at the call: a dtype mix numpy cannot type).
    """
    return ElementwiseKernel(expression, name=name)
