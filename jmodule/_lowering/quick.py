"""Small eager programs compiled with XLA:CPU options that compile faster.

An eager step compiles each program it meets on the first call of a shape
(the tape's forward and backward programs, the optimizer's update). XLA:CPU
has two code generators for its loop kernels: the MLIR "fusion emitters"
(its default) and the older LLVM emitters, which compile a kernel in about
half the time. For small arrays they run as fast; for large transposes and
some reductions the older ones are slower. So a program compiled here uses
the older emitters when every array it reads, writes or keeps is small, and
only when called eagerly: ``jax.jit`` refuses ``compiler_options`` on a
program traced into another (``jm.compile``, ``jax.grad`` around an eager
call), which then gets the plain program. The design note
(``jmodule/_lowering/README.md``, "Small programs compiled quick") has the
measurements behind the limits.

JAX 0.12's XLA has only the MLIR emitters; there such a program is compiled
for 128-bit vectors instead of the machine's widest, which compiles the small
CNN's backward in 0.30 s instead of 0.41 and runs as fast
(``_jax_internals.QUICK_COMPILE_OPTIONS`` holds the options for this JAX).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import jax

from jmodule import _jax_internals as _jx

__all__ = ["BACKWARD_LIMIT", "FORWARD_LIMIT", "PRODUCT_LIMIT", "Jit", "fits"]

#: The most elements an array of a tape's forward program may hold for the program to
#: compile quick: a larger forward (the small CNN's fused conv/pool/ReLU program, arrays
#: of 200,704 elements) ran 13-15% slower with the older emitters.
FORWARD_LIMIT = 1 << 16

#: The same for backward programs and optimizer updates (the small CNN's backward and
#: ResNet-18's ran as fast; nanoGPT's linear backward, arrays of 524,288, 28% slower).
BACKWARD_LIMIT = 1 << 18

#: The most elements a matrix product of a tape node may make for its programs to
#: compile quick: the backward of a product transposes the cotangent of its result, a
#: kernel the older emitters write slower (nanoGPT's output layer's backward, 17-20%).
PRODUCT_LIMIT = 1 << 14


def fits(shapes: Iterable[Any], limit: int) -> bool:
    """Whether every array of ``shapes`` (anything with a ``.shape``) has ``limit`` elements
    or fewer."""
    for a in shapes:
        size = 1
        for d in a.shape:
            size *= d
        if size > limit:
            return False
    return True


class Jit:
    """``jax.jit(fn)``, compiled quick when called eagerly and its arrays are small.

    Args:
        fn: the function to compile.
        quick: whether it may compile quick (its arrays small enough,
            :func:`fits`); None decides on the first eager call, from the
            leaves of its arguments (an elementwise optimizer update, whose
            outputs are shaped as its inputs).

    >>> import jax.numpy as jnp
    >>> f = Jit(lambda x: x * 2, quick=True)
    >>> f(jnp.ones(3)).tolist()
    [2.0, 2.0, 2.0]
    """

    __slots__ = ("_fn", "_plain", "_quick", "_small")

    def __init__(self, fn: Callable, quick: bool | None):
        self._fn = fn
        self._plain = jax.jit(fn)
        self._quick: Callable | None = None
        self._small = quick

    def __call__(self, *args: Any) -> Any:
        quick = self._quick
        if quick is None:
            small = self._small
            if small is False or type(_jx.current_trace()) is not _jx.EvalTrace:
                return self._plain(*args)
            if small is None:
                small = self._small = fits(jax.tree_util.tree_leaves(args), BACKWARD_LIMIT)
                if not small:
                    return self._plain(*args)
            # Made on the first eager call: a program only ever traced into others
            # (jm.compile) makes no second jax.jit.
            quick = self._quick = jax.jit(self._fn, compiler_options=_jx.QUICK_COMPILE_OPTIONS)
        elif type(_jx.current_trace()) is not _jx.EvalTrace:
            return self._plain(*args)
        return quick(*args)
