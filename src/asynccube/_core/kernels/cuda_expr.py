"""CUDA C of a typed tree (:mod:`.typing`), and the helpers it calls (:data:`PREAMBLE`).

A value is computed in its dtype's C value type (:func:`.dtypes.c_value`); a float16
value is held in a ``float`` and rounded to float16 after each operation, as numpy
does, with PTX conversions (no CUDA header needed). Every operation's result is
converted back to its dtype, so narrow integers wrap as numpy's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from .dtypes import c_value
from .expr import Arg, Const
from .ops import c_expr
from .typing import Typed

__all__ = ["PREAMBLE", "c_literal", "convert", "emit"]

PREAMBLE: Final = r"""
#include <asynccube.h>
__device__ __forceinline__ float ac_h2f(unsigned short h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short ac_f2h(float f) {
    unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ unsigned short ac_d2h(double d) {
    unsigned short h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h) : "d"(d)); return h; }
__device__ __forceinline__ float ac_rh(float f) { return ac_h2f(ac_f2h(f)); }
__device__ __forceinline__ float ac_rhd(double d) { return ac_h2f(ac_d2h(d)); }
template <typename T> __device__ __forceinline__ T ac_min(T a, T b) {
    return (a != a) ? a : ((b != b || b < a) ? b : a); }
template <typename T> __device__ __forceinline__ T ac_max(T a, T b) {
    return (a != a) ? a : ((b != b || b > a) ? b : a); }
template <typename T> __device__ __forceinline__ T ac_sign(T a) {
    return a > 0 ? T(1) : (a < 0 ? T(-1) : a); }
template <typename T> __device__ __forceinline__ T ac_floordiv_s(T a, T b) {
    if (b == 0) return 0;
    if (b == T(-1)) return T(0ULL - (unsigned long long)a);
    T q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? T(q - 1) : q; }
template <typename T> __device__ __forceinline__ T ac_floordiv_u(T a, T b) {
    return b == 0 ? T(0) : T(a / b); }
template <typename T> __device__ __forceinline__ T ac_mod_s(T a, T b) {
    if (b == 0 || b == T(-1)) return 0;
    T r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r; }
template <typename T> __device__ __forceinline__ T ac_mod_u(T a, T b) {
    return b == 0 ? T(0) : T(a % b); }
template <typename T> __device__ __forceinline__ T ac_fmod_s(T a, T b) {
    return (b == 0 || b == T(-1)) ? T(0) : T(a % b); }
template <typename T> __device__ __forceinline__ T ac_fmod_u(T a, T b) {
    return b == 0 ? T(0) : T(a % b); }
template <typename T> __device__ __forceinline__ T ac_ipow(T a, T b) {
    if (b < 0) return a == T(1) ? T(1) : (a == T(-1) ? ((b & 1) ? T(-1) : T(1)) : T(0));
    T r = 1;
    while (b) { if (b & 1) r = T(r * a); a = T(a * a); b = T(b >> 1); }
    return r; }
__device__ __forceinline__ float ac_fmodx(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double ac_fmodx(double a, double b) { return fmod(a, b); }
__device__ __forceinline__ float ac_floorx(float a) { return floorf(a); }
__device__ __forceinline__ double ac_floorx(double a) { return floor(a); }
__device__ __forceinline__ float ac_copysignx(float a, float b) { return copysignf(a, b); }
__device__ __forceinline__ double ac_copysignx(double a, double b) { return copysign(a, b); }
template <typename T> __device__ __forceinline__ T ac_mod(T a, T b) {
    T m = ac_fmodx(a, b);
    if (b == 0) return m;
    if (m != 0) { if ((b < 0) != (m < 0)) m += b; } else m = ac_copysignx(T(0), b);
    return m; }
template <typename T> __device__ __forceinline__ T ac_floordiv(T a, T b) {
    if (b == 0) return a / b;
    T m = ac_fmodx(a, b);
    T d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d == 0) return ac_copysignx(T(0), a / b);
    T f = ac_floorx(d);
    return (d - f > T(0.5)) ? T(f + 1) : f; }
"""
"""The helpers every generated kernel starts with."""


def c_literal(value: bool | int | float) -> str:
    """A literal in C: a weak int is a ``long long``, a weak float a ``double``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value}LL" if value >= 0 else f"({value}LL)"
    text = repr(float(value))
    return text if text[0] != "-" else f"({text})"


def convert(expr: str, src: np.dtype[Any], dst: np.dtype[Any]) -> str:
    """``expr`` (a value of ``src``) as a value of ``dst``, as numpy casts it."""
    if src == dst:
        return expr
    if dst == np.float16:
        return f"ac_rhd({expr})" if src == np.float64 else f"ac_rh((float)({expr}))"
    if dst == np.bool_:
        return f"(({expr}) != 0)"
    return f"(({c_value(dst)})({expr}))"


def _result(expr: str, dst: np.dtype[Any]) -> str:
    """An operation's C result (in C's own promoted type) as a value of ``dst``."""
    if dst == np.float16:
        return f"ac_rh({expr})"
    return f"(({c_value(dst)})({expr}))"


def emit(typed: Typed, names: Mapping[str, str]) -> str:
    """The C expression of ``typed``; ``names`` maps each name to its C value."""
    node = typed.node
    if isinstance(node, Arg):
        return names[node.name]
    if isinstance(node, Const):
        return c_literal(node.value)
    args = [emit(a, names) for a in typed.args]
    if node.op.startswith("cast:"):
        return convert(args[0], typed.args[0].dtype, typed.dtype)
    converted = [
        convert(a, t.dtype, dt) for a, t, dt in zip(args, typed.args, typed.loop, strict=True)
    ]
    if node.op == "where":
        cond, a, b = converted
        return f"({cond} ? {a} : {b})"
    return _result(c_expr(node.op, typed.loop[0], converted), typed.dtype)
