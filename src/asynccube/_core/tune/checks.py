"""Autotune checks: run every implementation on the same inputs and compare the outputs
(cubecl's ``autotune-checks`` feature, as an option instead of a build feature).

Outputs are turned into numpy arrays (``Tensor`` outputs are read back; give
``TuneChecks(convert=...)`` for anything else, e.g. a raw ``Handle``) and compared with
the reference implementation's (the set's default, unless ``reference=`` names
another) using ``numpy.allclose(rtol, atol, equal_nan=True)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..client.tensor import Tensor
from ..errors import InvalidArgument
from ..values.types import Binding, Handle
from .key import AutotuneKey
from .tunable import TunableSet

if TYPE_CHECKING:
    from ..client.client import ComputeClient

__all__ = ["CheckMismatch", "CheckReport", "TuneChecks", "run_checks"]

Arrays = list[npt.NDArray[Any]]
Convert = Callable[["ComputeClient", Any], Any]


@dataclass(frozen=True, slots=True)
class TuneChecks:
    """Options of the output checks.

    Attributes:
        rtol: Relative tolerance (``numpy.allclose``).
        atol: Absolute tolerance.
        strict: Raise :class:`~asynccube.AutotuneCheckError` (and use no result for the
            key) when an implementation disagrees; otherwise the report is logged as a
            warning and kept in ``Tuner.check_reports``.
        reference: Index or name of the reference implementation (default: the set's
            default).
        convert: ``convert(client, output) -> array | sequence of arrays`` (sync or
            async) turning an implementation's output into numpy arrays. Default:
            arrays and numbers as they are, ``Tensor`` read back, tuples/lists
            element by element.
    """

    rtol: float = 1e-5
    atol: float = 1e-8
    strict: bool = False
    reference: int | str | None = None
    convert: Convert | None = None

    def __post_init__(self) -> None:
        if self.rtol < 0 or self.atol < 0:
            raise InvalidArgument("TuneChecks: rtol and atol must be >= 0")


@dataclass(frozen=True, slots=True)
class CheckMismatch:
    """An implementation whose output disagrees with the reference's (or that failed).

    Attributes:
        name: The implementation's name.
        index: Its index.
        detail: What differs (shapes, the largest difference and where, or the error).
        max_abs_diff: The largest absolute difference, when shapes agree.
    """

    name: str
    index: int
    detail: str
    max_abs_diff: float | None = None

    def __str__(self) -> str:
        return f"{self.name} [{self.index}]: {self.detail}"


@dataclass(frozen=True, slots=True)
class CheckReport:
    """The result of comparing every implementation's output for one key.

    Attributes:
        key: The key checked.
        reference: Name of the reference implementation.
        agreeing: Names of the implementations that agree with it.
        mismatches: The implementations that disagree (or failed), with details.
        rtol: Relative tolerance used.
        atol: Absolute tolerance used.
    """

    key: AutotuneKey
    reference: str
    agreeing: tuple[str, ...]
    mismatches: tuple[CheckMismatch, ...]
    rtol: float
    atol: float

    @property
    def ok(self) -> bool:
        """True if every implementation agrees with the reference."""
        return not self.mismatches

    @property
    def disagreeing(self) -> tuple[str, ...]:
        """Names of the implementations that disagree or failed."""
        return tuple(m.name for m in self.mismatches)

    def __str__(self) -> str:
        head = f"autotune checks for {self.key} against {self.reference!r}"
        if self.ok:
            return f"{head}: all {len(self.agreeing) + 1} implementations agree"
        lines = "\n".join(f"  {m}" for m in self.mismatches)
        return (
            f"{head} (rtol={self.rtol}, atol={self.atol}): {len(self.mismatches)} disagree\n{lines}"
        )


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def to_arrays(client: ComputeClient, output: Any, convert: Convert | None) -> Arrays:
    """``output`` as a list of numpy arrays (see :class:`TuneChecks`)."""
    if convert is not None:
        output = await _maybe_await(convert(client, output))
        if isinstance(output, list | tuple):
            return [np.asarray(o) for o in output]
        return [np.asarray(output)]
    if isinstance(output, Tensor):
        return [await client.read_array(output)]
    if isinstance(output, Handle | Binding):
        raise InvalidArgument(
            "autotune checks cannot compare a raw Handle/Binding: return a Tensor, or "
            "give TuneChecks(convert=...) reading it as an array"
        )
    if isinstance(output, list | tuple):
        return [a for item in output for a in await to_arrays(client, item, None)]
    if isinstance(output, bytes | bytearray | memoryview):
        return [np.frombuffer(output, dtype=np.uint8)]
    if isinstance(output, np.ndarray | np.generic | int | float | complex | bool):
        return [np.asarray(output)]
    raise InvalidArgument(
        f"autotune checks cannot compare a {type(output).__name__}; give "
        "TuneChecks(convert=...) turning it into numpy arrays"
    )


def compare(
    reference: Arrays, other: Arrays, rtol: float, atol: float
) -> tuple[str, float | None] | None:
    """None if ``other`` matches ``reference``; else (what differs, max abs diff)."""
    if len(reference) != len(other):
        return f"{len(other)} outputs, the reference has {len(reference)}", None
    for i, (ref, out) in enumerate(zip(reference, other, strict=True)):
        problem = _compare_one(ref, out, rtol, atol)
        if problem is not None:
            where = f"output {i}: " if len(reference) > 1 else ""
            return where + problem[0], problem[1]
    return None


def _compare_one(
    ref: npt.NDArray[Any], out: npt.NDArray[Any], rtol: float, atol: float
) -> tuple[str, float | None] | None:
    if ref.shape != out.shape:
        return f"shape {out.shape} != reference shape {ref.shape}", None
    try:
        same = np.allclose(out, ref, rtol=rtol, atol=atol, equal_nan=True)
    except TypeError:  # non-numeric dtypes
        same = bool(np.array_equal(out, ref))
        return None if same else ("values differ", None)
    if same:
        return None
    diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
    worst = int(np.nanargmax(diff)) if diff.size else 0
    at = np.unravel_index(worst, diff.shape) if diff.ndim else ()
    max_diff = float(diff.flat[worst]) if diff.size else float("nan")
    return (
        f"max abs diff {max_diff:.6g} at {tuple(int(i) for i in at)} "
        f"(got {out.flat[worst]!r}, reference {ref.flat[worst]!r})",
        max_diff,
    )


async def run_checks(
    client: ComputeClient,
    tunables: TunableSet[Any, Any, Any],
    key: AutotuneKey,
    inputs: Any,
    checks: TuneChecks,
) -> CheckReport:
    """Run every implementation once on ``inputs`` and compare with the reference."""
    results = [await _output_of(client, t, inputs, checks.convert) for t in tunables]
    ref_index = tunables.index_of(
        tunables.default_index if checks.reference is None else checks.reference
    )
    ref_name = tunables.names[ref_index]
    reference = results[ref_index]
    if isinstance(reference, BaseException):
        return _reference_failed(tunables.names, ref_index, reference, key, checks)
    agreeing: list[str] = []
    mismatches: list[CheckMismatch] = []
    for index, (name, result) in enumerate(zip(tunables.names, results, strict=True)):
        if index == ref_index:
            continue
        problem = _judge(reference, result, checks)
        if problem is None:
            agreeing.append(name)
        else:
            mismatches.append(CheckMismatch(name, index, *problem))
    return CheckReport(key, ref_name, tuple(agreeing), tuple(mismatches), checks.rtol, checks.atol)


def _reference_failed(
    names: tuple[str, ...],
    ref_index: int,
    error: BaseException,
    key: AutotuneKey,
    checks: TuneChecks,
) -> CheckReport:
    detail = f"failed: {type(error).__name__}: {error}"
    mismatches = [CheckMismatch(names[ref_index], ref_index, f"(reference) {detail}")]
    mismatches += [
        CheckMismatch(name, i, "not compared: the reference failed")
        for i, name in enumerate(names)
        if i != ref_index
    ]
    return CheckReport(key, names[ref_index], (), tuple(mismatches), checks.rtol, checks.atol)


def _judge(
    reference: Arrays, result: Arrays | BaseException, checks: TuneChecks
) -> tuple[str, float | None] | None:
    if isinstance(result, BaseException):
        return f"failed: {type(result).__name__}: {result}", None
    return compare(reference, result, checks.rtol, checks.atol)


async def _output_of(
    client: ComputeClient, tunable: Any, inputs: Any, convert: Convert | None
) -> Arrays | Exception:
    try:
        output = await tunable(client, inputs)
        return await to_arrays(client, output, convert)
    except Exception as exc:
        return exc
