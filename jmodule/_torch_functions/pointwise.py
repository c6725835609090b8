"""Elementwise functions, comparisons and tests: ``jm.exp``, ``jm.add``, ``jm.clamp``,
``jm.isclose``, ``jm.allclose``, ...

Floating functions (``exp``, ``sin``, ``sqrt``, ...) compute integer and bool
inputs in the default float dtype, as PyTorch does. Python numbers combine
with arrays as PyTorch's scalars do (``jm.mul(x, 2.0)`` keeps ``x``'s dtype).
``abs``, ``pow`` and ``round`` are served as ``jm.abs``/``jm.pow``/``jm.round``
without rebinding Python's builtins (see :data:`BUILTIN_NAMED`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import numpy as np

from jmodule._torch_functions._common import arr, default_float, float_input, out_dtype
from jmodule.amp import _autocast as _amp

__all__ = [
    "absolute",
    "acos",
    "acosh",
    "add",
    "addcdiv",
    "addcmul",
    "allclose",
    "angle",
    "arccos",
    "arccosh",
    "arcsin",
    "arcsinh",
    "arctan",
    "arctan2",
    "arctanh",
    "asin",
    "asinh",
    "atan",
    "atan2",
    "atanh",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "ceil",
    "clamp",
    "clamp_max",
    "clamp_min",
    "clip",
    "conj",
    "copysign",
    "cos",
    "cosh",
    "deg2rad",
    "digamma",
    "div",
    "divide",
    "eq",
    "equal",
    "erf",
    "erfc",
    "erfinv",
    "exp",
    "exp2",
    "expm1",
    "fix",
    "float_power",
    "floor",
    "floor_divide",
    "fmax",
    "fmin",
    "fmod",
    "frac",
    "ge",
    "greater",
    "greater_equal",
    "gt",
    "heaviside",
    "hypot",
    "imag",
    "isclose",
    "isfinite",
    "isin",
    "isinf",
    "isnan",
    "isneginf",
    "isposinf",
    "isreal",
    "le",
    "lerp",
    "less",
    "less_equal",
    "lgamma",
    "log",
    "log1p",
    "log2",
    "log10",
    "logaddexp",
    "logaddexp2",
    "logical_and",
    "logical_not",
    "logical_or",
    "logical_xor",
    "logit",
    "lt",
    "maximum",
    "minimum",
    "mul",
    "multiply",
    "nan_to_num",
    "ne",
    "neg",
    "negative",
    "not_equal",
    "polar",
    "positive",
    "rad2deg",
    "real",
    "reciprocal",
    "relu",
    "remainder",
    "rsqrt",
    "rsub",
    "sgn",
    "sigmoid",
    "sign",
    "signbit",
    "sin",
    "sinc",
    "sinh",
    "sqrt",
    "square",
    "sub",
    "subtract",
    "tan",
    "tanh",
    "true_divide",
    "trunc",
    "xlogy",
]


def _floating(name: str, fn: Callable, doc: str) -> Callable:
    def op(input: Any, *, out: Any = None) -> jax.Array:
        return fn(float_input(arr(input)))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{doc}, elementwise (integer inputs computed in the default float dtype)."
    return op


def _same(name: str, fn: Callable, doc: str) -> Callable:
    def op(input: Any, *, out: Any = None) -> jax.Array:
        return fn(arr(input))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{doc}, elementwise (the input's dtype)."
    return op


exp = _floating("exp", jnp.exp, "e ** x")
exp2 = _floating("exp2", jnp.exp2, "2 ** x")
expm1 = _floating("expm1", jnp.expm1, "e ** x - 1")
log = _floating("log", jnp.log, "Natural logarithm")
log2 = _floating("log2", jnp.log2, "Base-2 logarithm")
log10 = _floating("log10", jnp.log10, "Base-10 logarithm")
log1p = _floating("log1p", jnp.log1p, "log(1 + x)")
sqrt = _floating("sqrt", jnp.sqrt, "Square root")
rsqrt = _floating("rsqrt", jax.lax.rsqrt, "1 / sqrt(x)")
sigmoid = _floating("sigmoid", jax.nn.sigmoid, "1 / (1 + e ** -x)")
tanh = _floating("tanh", jnp.tanh, "Hyperbolic tangent")
erf = _floating("erf", jsp.erf, "The error function")
erfc = _floating("erfc", jsp.erfc, "1 - erf(x)")
erfinv = _floating("erfinv", jsp.erfinv, "The inverse error function")
lgamma = _floating("lgamma", jsp.gammaln, "log |gamma(x)|")
digamma = _floating("digamma", jsp.digamma, "The digamma function")
sin = _floating("sin", jnp.sin, "Sine")
cos = _floating("cos", jnp.cos, "Cosine")
tan = _floating("tan", jnp.tan, "Tangent")
asin = arcsin = _floating("asin", jnp.arcsin, "Inverse sine")
acos = arccos = _floating("acos", jnp.arccos, "Inverse cosine")
atan = arctan = _floating("atan", jnp.arctan, "Inverse tangent")
sinh = _floating("sinh", jnp.sinh, "Hyperbolic sine")
cosh = _floating("cosh", jnp.cosh, "Hyperbolic cosine")
asinh = arcsinh = _floating("asinh", jnp.arcsinh, "Inverse hyperbolic sine")
acosh = arccosh = _floating("acosh", jnp.arccosh, "Inverse hyperbolic cosine")
atanh = arctanh = _floating("atanh", jnp.arctanh, "Inverse hyperbolic tangent")
reciprocal = _floating("reciprocal", jnp.reciprocal, "1 / x")
sinc = _floating("sinc", jnp.sinc, "sin(pi x) / (pi x)")
deg2rad = _floating("deg2rad", jnp.deg2rad, "Degrees to radians")
rad2deg = _floating("rad2deg", jnp.rad2deg, "Radians to degrees")
neg = negative = _same("neg", jnp.negative, "-x")
positive = _same("positive", jnp.positive, "+x")
square = _same("square", jnp.square, "x * x")
sign = _same("sign", jnp.sign, "-1, 0 or 1 by the sign of x")
sgn = _same("sgn", jnp.sign, "sign(x) (x / |x| for complex x)")
floor = _same("floor", jnp.floor, "Round down")
ceil = _same("ceil", jnp.ceil, "Round up")
trunc = fix = _same("trunc", jnp.trunc, "Round towards zero")
frac = _same("frac", lambda x: x - jnp.trunc(x), "x - trunc(x)")
signbit = _same("signbit", jnp.signbit, "Whether the sign bit is set")
relu = _same("relu", jax.nn.relu, "max(x, 0)")
isnan = _same("isnan", jnp.isnan, "Whether x is NaN")
isinf = _same("isinf", jnp.isinf, "Whether x is +-inf")
isfinite = _same("isfinite", jnp.isfinite, "Whether x is finite")
isposinf = _same("isposinf", jnp.isposinf, "Whether x is +inf")
isneginf = _same("isneginf", jnp.isneginf, "Whether x is -inf")
isreal = _same("isreal", jnp.isreal, "Whether x has no imaginary part")
real = _same("real", jnp.real, "The real part")
imag = _same("imag", jnp.imag, "The imaginary part")
conj = _same("conj", jnp.conj, "The complex conjugate")
angle = _floating("angle", jnp.angle, "The complex argument")
logical_not = _same("logical_not", jnp.logical_not, "not x")
bitwise_not = _same("bitwise_not", jnp.bitwise_not, "~x")


def _abs(input: Any, *, out: Any = None) -> jax.Array:
    """|x|, elementwise (the input's dtype; complex inputs give their real dtype)."""
    return jnp.abs(arr(input))


absolute = _abs


def _binary(name: str, fn: Callable, doc: str) -> Callable:
    def op(input: Any, other: Any, *, out: Any = None) -> jax.Array:
        return fn(arr(input), arr(other))

    op.__name__ = op.__qualname__ = name
    op.__doc__ = f"{doc}, elementwise with broadcasting."
    return op


def _int(x: jax.Array) -> bool:
    return not jnp.issubdtype(x.dtype, jnp.inexact)


def _both_float(fn: Callable) -> Callable:
    def apply(a: jax.Array, b: jax.Array) -> jax.Array:
        if _int(a) and _int(b):
            a = a.astype(default_float())
        return fn(a, b)

    return apply


mul = multiply = _binary("mul", jnp.multiply, "input * other")
maximum = _binary("maximum", jnp.maximum, "The larger of the two (NaN propagates)")
minimum = _binary("minimum", jnp.minimum, "The smaller of the two (NaN propagates)")
fmax = _binary("fmax", jnp.fmax, "The larger of the two (NaN ignored)")
fmin = _binary("fmin", jnp.fmin, "The smaller of the two (NaN ignored)")
fmod = _binary("fmod", jnp.fmod, "C's remainder (the sign of input)")
remainder = _binary("remainder", jnp.remainder, "Python's remainder (the sign of other)")
floor_divide = _binary("floor_divide", jnp.floor_divide, "floor(input / other)")
atan2 = arctan2 = _binary("atan2", _both_float(jnp.arctan2), "atan(input / other), by quadrant")
hypot = _binary("hypot", jnp.hypot, "sqrt(input ** 2 + other ** 2)")
logaddexp = _binary("logaddexp", jnp.logaddexp, "log(e ** input + e ** other)")
logaddexp2 = _binary("logaddexp2", jnp.logaddexp2, "log2(2 ** input + 2 ** other)")
copysign = _binary("copysign", _both_float(jnp.copysign), "|input| with the sign of other")
xlogy = _binary("xlogy", _both_float(jsp.xlogy), "input * log(other), 0 where input is 0")
heaviside = _binary("heaviside", jnp.heaviside, "0 below 0, other at 0, 1 above")
eq = _binary("eq", jnp.equal, "input == other")
ne = not_equal = _binary("ne", jnp.not_equal, "input != other")
lt = less = _binary("lt", jnp.less, "input < other")
le = less_equal = _binary("le", jnp.less_equal, "input <= other")
gt = greater = _binary("gt", jnp.greater, "input > other")
ge = greater_equal = _binary("ge", jnp.greater_equal, "input >= other")
logical_and = _binary("logical_and", jnp.logical_and, "input and other")
logical_or = _binary("logical_or", jnp.logical_or, "input or other")
logical_xor = _binary("logical_xor", jnp.logical_xor, "input xor other")
bitwise_and = _binary("bitwise_and", jnp.bitwise_and, "input & other")
bitwise_or = _binary("bitwise_or", jnp.bitwise_or, "input | other")
bitwise_xor = _binary("bitwise_xor", jnp.bitwise_xor, "input ^ other")


def add(input: Any, other: Any, *, alpha: Any = 1, out: Any = None) -> jax.Array:
    """``input + alpha * other``."""
    b = arr(other)
    return arr(input) + (b if alpha == 1 else alpha * b)


def sub(input: Any, other: Any, *, alpha: Any = 1, out: Any = None) -> jax.Array:
    """``input - alpha * other``."""
    b = arr(other)
    return arr(input) - (b if alpha == 1 else alpha * b)


subtract = sub


def rsub(input: Any, other: Any, *, alpha: Any = 1) -> jax.Array:
    """``other - alpha * input``."""
    return sub(other, input, alpha=alpha)


def div(input: Any, other: Any, *, rounding_mode: str | None = None, out: Any = None) -> jax.Array:
    """``input / other``: true division (integers give the default float dtype), or
    rounded with ``rounding_mode="trunc"`` / ``"floor"`` (then the inputs' dtype)."""
    a, b = arr(input), arr(other)
    if rounding_mode is None:
        return _both_float(jnp.true_divide)(a, b)
    if rounding_mode == "floor":
        return jnp.floor_divide(a, b) if _int(a) and _int(b) else jnp.floor(a / b)
    if rounding_mode == "trunc":
        if _int(a) and _int(b):
            q = jnp.floor_divide(a, b)
            return jnp.where((q < 0) & (q * b != a), q + 1, q)
        return jnp.trunc(a / b)
    raise ValueError(
        "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found "
        f"'{rounding_mode}'"
    )


divide = div


def true_divide(dividend: Any, divisor: Any, *, out: Any = None) -> jax.Array:
    """``dividend / divisor`` (true division)."""
    return div(dividend, divisor)


def _pow(input: Any, exponent: Any, *, out: Any = None) -> jax.Array:
    """``input ** exponent`` (either may be a number).

    Raises:
        RuntimeError: an integer array to a negative integer power.
    """
    a, b = arr(input), arr(exponent)
    if _int(a) and _int(b) and a.dtype != jnp.bool_ and not isinstance(b, jax.core.Tracer):
        if bool(np.any(np.asarray(b) < 0)):
            raise RuntimeError("Integers to negative integer powers are not allowed.")
    return jnp.power(a, b)


def float_power(input: Any, exponent: Any, *, out: Any = None) -> jax.Array:
    """``input ** exponent`` in double precision, as ``torch.float_power``.

    Needs JAX's x64 mode (there is no float64 without it); raises jm.DtypeError
    otherwise.
    """
    dt = out_dtype(jnp.complex128 if jnp.iscomplexobj(arr(input)) else jnp.float64)
    return jnp.power(arr(input).astype(dt), arr(exponent).astype(dt))


def _round(input: Any, *, decimals: int = 0, out: Any = None) -> jax.Array:
    """Round half to even, to ``decimals`` decimal places (the input's dtype)."""
    x = arr(input)
    if _int(x):
        return x
    return jnp.round(x, int(decimals))


def clamp(input: Any, min: Any = None, max: Any = None, *, out: Any = None) -> jax.Array:
    """``input`` limited to ``[min, max]`` (numbers or arrays; where ``min > max`` the
    result is ``max``, as in PyTorch).

    Raises:
        RuntimeError: neither bound is given.
    """
    if min is None and max is None:
        raise RuntimeError("torch.clamp: At least one of 'min' or 'max' must not be None")
    x = arr(input)
    parts = [x] + [arr(v) for v in (min, max) if v is not None]
    dt = jnp.result_type(*parts)
    x = x.astype(dt)
    if min is not None:
        x = jnp.maximum(x, arr(min).astype(dt))
    if max is not None:
        x = jnp.minimum(x, arr(max).astype(dt))
    return x


clip = clamp


def clamp_min(input: Any, min: Any) -> jax.Array:
    """``clamp(input, min=min)``."""
    return clamp(input, min=min)


def clamp_max(input: Any, max: Any) -> jax.Array:
    """``clamp(input, max=max)``."""
    return clamp(input, max=max)


def lerp(input: Any, end: Any, weight: Any, *, out: Any = None) -> jax.Array:
    """``input + weight * (end - input)``, computed as PyTorch does (from the nearer end)."""
    a, b, w = arr(input), arr(end), arr(weight)
    d = b - a
    return jnp.where(jnp.abs(w) < 0.5, a + w * d, b - d * (1 - w)).astype(jnp.result_type(a, b))


def addcmul(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> jax.Array:
    """``input + value * tensor1 * tensor2``."""
    return arr(input) + value * arr(tensor1) * arr(tensor2)


def addcdiv(input: Any, tensor1: Any, tensor2: Any, *, value: Any = 1) -> jax.Array:
    """``input + value * tensor1 / tensor2``."""
    return arr(input) + value * (arr(tensor1) / arr(tensor2))


def logit(input: Any, eps: float | None = None) -> jax.Array:
    """``log(p / (1 - p))``, with ``p`` clamped to ``[eps, 1 - eps]`` when ``eps`` is given."""
    p = float_input(arr(input))
    if eps is not None:
        p = jnp.clip(p, eps, 1 - eps)
    return jnp.log(p / (1 - p))


def isin(
    elements: Any, test_elements: Any, *, assume_unique: bool = False, invert: bool = False
) -> jax.Array:
    """Whether each of ``elements`` is in ``test_elements`` (bool, ``elements``' shape)."""
    return jnp.isin(arr(elements), arr(test_elements), assume_unique=assume_unique, invert=invert)


def polar(abs: Any, angle: Any, *, out: Any = None) -> jax.Array:
    """The complex numbers ``abs * (cos(angle) + i sin(angle))``; under ``jm.autocast``
    on CPU from float32 parts, as PyTorch's."""
    r, t = _amp.cast("polar", arr(abs), arr(angle))
    return jax.lax.complex(r * jnp.cos(t), r * jnp.sin(t))


def _complex(real: Any, imag: Any, *, out: Any = None) -> jax.Array:
    """The complex numbers ``real + i imag`` (float32 parts give complex64)."""
    r, i = arr(real), arr(imag)
    if not jnp.issubdtype(r.dtype, jnp.floating):
        raise RuntimeError(
            f"Expected both inputs to be Half, Float or Double tensors but got {r.dtype} and "
            f"{i.dtype}"
        )
    if r.dtype != i.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {r.dtype} but got scalar type {i.dtype} for "
            "second argument"
        )
    return jax.lax.complex(r, i)


def nan_to_num(
    input: Any,
    nan: float = 0.0,
    posinf: float | None = None,
    neginf: float | None = None,
    *,
    out: Any = None,
) -> jax.Array:
    """NaN, +inf and -inf replaced (by 0 and the dtype's largest / lowest value unless
    given)."""
    return jnp.nan_to_num(arr(input), nan=nan, posinf=posinf, neginf=neginf)


def isclose(
    input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> jax.Array:
    """Whether ``|input - other| <= atol + rtol * |other|``, elementwise (bool)."""
    return jnp.isclose(arr(input), arr(other), rtol=rtol, atol=atol, equal_nan=equal_nan)


_TRACED_BOOL = (
    "jm.{name} returns a Python bool, which a traced (compiled) value cannot give: its value "
    "is not known while the program is traced. Inside jm.compile / jax.jit use "
    "{instead} (an array), or call jm.{name} eagerly."
)


def _python_bool(name: str, instead: str, value: jax.Array) -> bool:
    if isinstance(value, jax.core.Tracer):
        raise TypeError(_TRACED_BOOL.format(name=name, instead=instead))
    return bool(value)


def allclose(
    input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False
) -> bool:
    """Whether every element is close (see :func:`isclose`): a Python ``bool``, as in
    PyTorch. Eager only; inside compiled code use ``jm.isclose(a, b).all()``."""
    value = jnp.all(isclose(input, other, rtol, atol, equal_nan))
    return _python_bool("allclose", "jm.isclose(a, b).all()", value)


def equal(input: Any, other: Any) -> bool:
    """Whether both have the same shape and elements: a Python ``bool``. Eager only."""
    a, b = arr(input), arr(other)
    if a.shape != b.shape:
        return False
    return _python_bool("equal", "(a == b).all()", jnp.all(a == b))


#: Public names that are Python builtins, served by ``jmodule.__getattr__``.
BUILTIN_NAMED = {"abs": _abs, "complex": _complex, "pow": _pow, "round": _round}
for _name, _fn in BUILTIN_NAMED.items():
    _fn.__name__ = _fn.__qualname__ = _name
