"""``jmodule/_array_patches.py`` is the one module that changes JAX's classes (issue 29).

It adds teaching errors (``backward``, PyTorch's in-place methods, ``view``
with a shape) to JAX's array and tracer classes; the errors themselves are
tested in ``test_teaching_errors.py`` and ``test_inplace_hints.py``. Here: JAX's
own ``view(dtype)`` still does what JAX documents (a bit reinterpretation; the
last axis scaled when the item size changes), on arrays and under
``jax.jit``, and importing jmodule changes nothing else on JAX's classes.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule  # noqa: F401  (installs the patches)
from jmodule import _array_patches
from jmodule._jax_internals import ArrayImpl

EAGER_AND_JIT = pytest.mark.parametrize("run", ["eager", "jit"])


def _view(run: str, x: jax.Array, *args, **kwargs) -> jax.Array:
    fn = lambda a: a.view(*args, **kwargs)
    return fn(x) if run == "eager" else jax.jit(fn)(x)


def _floats() -> np.ndarray:
    return np.array([[1.0, -2.5, 3.25], [np.pi, -0.0, 1e-30]], np.float32)


@EAGER_AND_JIT
def test_view_float32_as_int32_gives_numpys_bits(run):
    x = _floats()
    for dtype in (jnp.int32, np.int32, np.dtype("int32"), "int32", jnp.uint32):
        out = _view(run, jnp.asarray(x), dtype)
        assert out.shape == x.shape and out.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(np.asarray(out), x.view(np.dtype(dtype)))
    out = _view(run, jnp.asarray(x), dtype=jnp.int32)  # the keyword, as JAX names it
    np.testing.assert_array_equal(np.asarray(out), x.view(np.int32))


@EAGER_AND_JIT
@pytest.mark.parametrize(("dtype", "last"), [(jnp.uint8, 12), (jnp.int16, 6), (jnp.uint16, 6)])
def test_view_to_a_smaller_item_scales_the_last_axis(run, dtype, last):
    x = _floats()
    out = _view(run, jnp.asarray(x), dtype)
    assert out.shape == (2, last) and out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(np.asarray(out), x.view(np.dtype(dtype)))


@EAGER_AND_JIT
def test_view_to_a_larger_item_and_back(run):
    raw = np.arange(16, dtype=np.uint8).reshape(2, 8)
    out = _view(run, jnp.asarray(raw), jnp.float32)
    assert out.shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(out).view(np.uint8), raw)
    back = _view(run, out, jnp.uint8)
    np.testing.assert_array_equal(np.asarray(back), raw)


@EAGER_AND_JIT
def test_view_as_documented_by_jax(run):
    """The examples of JAX's ``Array.view`` docstring."""
    assert _view(run, jnp.zeros([1, 2, 3], dtype=jnp.int16), jnp.int8).shape == (1, 2, 6)
    assert _view(run, jnp.zeros([1, 2, 4], dtype=jnp.int8), jnp.int16).shape == (1, 2, 2)
    flags = _view(run, jnp.array([1, 0, 1], dtype=jnp.int8), jnp.bool_)
    np.testing.assert_array_equal(np.asarray(flags), [True, False, True])


@EAGER_AND_JIT
def test_view_without_a_dtype_is_the_array_and_type_is_refused(run):
    x = jnp.asarray(_floats())
    for args in ((), (None,)):
        out = _view(run, x, *args)
        assert out.dtype == x.dtype and out.shape == x.shape
        np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    with pytest.raises(NotImplementedError):
        _view(run, x, jnp.int32, type=np.ndarray)


def test_view_keeps_jaxs_docstring():
    assert "bitwise copy" in ArrayImpl.view.__doc__  # help(x.view) shows JAX's


def test_view_with_a_shape_still_teaches():
    x = jnp.ones((2, 6))
    with pytest.raises(TypeError, match=r"x\.reshape\(3, -1\)"):
        x.view(3, -1)
    with pytest.raises(TypeError, match=r"reshape"):
        jax.jit(lambda a: a.view((4, 3)))(x)


# ------------------------------------------------------------------ nothing else is patched

_SNAPSHOT = """
import jax
from jax.core import Trace, Tracer
from jax._src.array import ArrayImpl

classes = {"ArrayImpl": ArrayImpl, "Tracer": Tracer, "Array": jax.Array, "Trace": Trace}
before = {name: dict(vars(cls)) for name, cls in classes.items()}
import jmodule
after = {name: dict(vars(cls)) for name, cls in classes.items()}
changed = {}
for name in classes:
    old, new = before[name], after[name]
    replaced = {k for k in new if k not in old or new[k] is not old[k]}
    changed[name] = sorted(replaced | (old.keys() - new.keys()))
print(repr(changed))
print(repr({name: sorted(before[name]) for name in classes}))
"""


@pytest.mark.slow
def test_importing_jmodule_changes_only_what_array_patches_adds():
    out = subprocess.run(
        [sys.executable, "-c", _SNAPSHOT], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    changed_line, before_line = out.stdout.strip().splitlines()[-2:]
    changed, before = ast.literal_eval(changed_line), ast.literal_eval(before_line)
    for name in ("ArrayImpl", "Tracer"):
        added = {n for n in _array_patches.INPLACE if n not in before[name]}
        want = {"view", "backward", "_jm_hints"} | added
        if name == "Tracer":
            want.add("__getattr__")
        assert set(changed[name]) == want, name
    assert changed["Array"] == [] and changed["Trace"] == []
