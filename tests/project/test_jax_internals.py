"""JAX's private API is used in one module, ``jmodule/_jax_internals.py`` (issue 29).

That module is the only one importing ``jax._src`` (in any form), each name it
exports says why and what public API would replace it, and what it exports
behaves on this JAX (0.10 or 0.12) as jmodule relies on: its trace tests, its
Tracer protocol helpers, and its matches on JAX's error texts, checked against
the errors JAX really raises.
"""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _paths import PACKAGE

from jmodule import _jax_internals as jx

THE_MODULE = PACKAGE / "_jax_internals.py"

# ------------------------------------------------------------------ who imports jax._src


def _is_private(name: str) -> bool:
    return name == "jax._src" or name.startswith("jax._src.")


def _private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each use of ``jax._src`` in ``source``: an import of any form,
    ``jax._src`` as an attribute, or an import of it in a string (an importlib call, or
    code run as a script)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _is_private(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if _is_private(module):
                found.append((node.lineno, f"from {module} import ..."))
            elif module == "jax" and any(a.name == "_src" for a in node.names):
                found.append((node.lineno, "from jax import _src"))
        elif (
            isinstance(node, ast.Attribute)
            and node.attr == "_src"
            and isinstance(node.value, ast.Name)
            and node.value.id == "jax"
        ):
            found.append((node.lineno, "jax._src"))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if (
                called in ("import_module", "__import__")
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and _is_private(first.value)
            ):
                found.append((node.lineno, f"{called}({first.value!r})"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for line in node.value.splitlines():
                words = line.split()
                if len(words) >= 2 and words[0] in ("import", "from") and _is_private(words[1]):
                    found.append((node.lineno, f"a string: {line.strip()!r}"))
    return found


@pytest.mark.slow
def test_only_the_one_module_imports_jax_src():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != THE_MODULE
        for line, what in _private_uses(path.read_text())
    ]
    assert not found, (
        "jax._src used outside jmodule/_jax_internals.py (put it there, with its reason in "
        "INTERNALS, and import it from there):\n" + "\n".join(found)
    )
    assert _private_uses(THE_MODULE.read_text())  # ... and the walk does see that module's


@pytest.mark.parametrize(
    "source",
    [
        "import jax._src.core",
        "import jax._src as s",
        "from jax._src import core",
        "from jax._src.array import ArrayImpl",
        "from jax import _src",
        "from jax import numpy, _src",
        "def f():\n    from jax._src.interpreters import ad",
        "import importlib\nimportlib.import_module('jax._src.core')",
        "from importlib import import_module\nimport_module('jax._src')",
        "__import__('jax._src.core')",
        "import jax\njax._src.core.trace_ctx",
        "SCRIPT = '''\nimport os\nfrom jax._src.interpreters import mlir\n'''",
    ],
)
def test_the_walk_sees_every_form_of_import(source):
    assert _private_uses(source), source


@pytest.mark.parametrize(
    "source",
    [
        "import jax.core",
        "from jax.extend import core",
        "from jax.interpreters import partial_eval",
        "x = 'jax._src is where JAX keeps its internals'",
        "from jmodule._jax_internals import ArrayImpl",
        "from . import _src",
    ],
)
def test_the_walk_passes_what_is_public(source):
    assert not _private_uses(source), source


def test_the_module_imports_nothing_of_jmodule():
    """So any module of the package can import it, and no import cycle goes through it."""
    for node in ast.walk(ast.parse(THE_MODULE.read_text())):
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] == "jmodule" for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert not node.level and (node.module or "").split(".")[0] != "jmodule"


# ------------------------------------------------------------------ each name has its reason


def test_every_exported_name_says_why_and_what_would_replace_it():
    exported = set(jx.__all__) - {"INTERNALS"}
    assert exported == set(jx.INTERNALS), (
        f"without a reason: {sorted(exported - set(jx.INTERNALS))}; "
        f"a reason for no export: {sorted(set(jx.INTERNALS) - exported)}"
    )
    for name, entry in jx.INTERNALS.items():
        assert hasattr(jx, name), name
        why, public = entry
        assert isinstance(why, str) and len(why.split()) >= 5, f"{name}: say why it is needed"
        assert isinstance(public, str) and public.strip(), f"{name}: name the public API, or none"
        assert public.startswith("none as of JAX") or "jax." in public, (
            f"{name}: {public!r} names no public jax API ('none as of JAX 0.12' if none)"
        )


def test_public_names_are_not_reexported():
    """What JAX has made public is used from JAX, not through the internals module."""
    for public in (jax.typeof, jax.core.Trace, jax.core.Tracer):
        assert all(v is not public for v in vars(jx).values() if not isinstance(v, type(jx)))


# ------------------------------------------------------------------ traces


def _seen(fn, *args):
    """``fn(*args)`` with what the internals say about the trace it runs on."""
    seen = {}

    def probe(x):
        trace = jx.current_trace()
        seen["trace"] = trace
        seen["staging"] = isinstance(trace, jx.DynamicJaxprTrace)
        seen["forward"] = jx.forward_mode(trace)
        seen["parent"] = jx.parent_trace(trace)
        seen["own"] = isinstance(x, jax.core.Tracer) and jx.trace_of(x) is trace
        return x * 2.0

    fn(probe, *args)
    return seen


def _outermost(trace):
    while jx.parent_trace(trace) is not None:
        trace = jx.parent_trace(trace)
    return trace


def test_the_traces_are_told_apart():
    x = jnp.float32(1.5)
    eager = _seen(lambda f, x: f(x), x)
    assert type(eager["trace"]) is jx.EvalTrace
    assert not eager["staging"] and not eager["forward"] and eager["parent"] is None

    jitted = _seen(lambda f, x: jax.jit(f)(x), x)
    assert jitted["staging"] and not jitted["forward"] and jitted["own"]

    for forward in (
        lambda f, x: jax.jvp(f, (x,), (x,)),
        lambda f, x: jax.linearize(f, x),
        lambda f, x: jax.jacfwd(f)(x),
    ):
        seen = _seen(forward, x)
        assert seen["forward"] and seen["own"] and not seen["staging"]
        assert type(_outermost(seen["trace"])) is jx.EvalTrace  # through jacfwd's vmap too

    for reverse in (lambda f, x: jax.grad(f)(x), lambda f, x: jax.vjp(f, x)):
        seen = _seen(reverse, x)
        assert not seen["forward"] and seen["own"]
        assert type(seen["parent"]) is jx.EvalTrace
        assert type(_outermost(seen["trace"])) is jx.EvalTrace

    inside = _seen(lambda f, x: jax.jit(jax.grad(f))(x), x)
    assert isinstance(inside["parent"], jx.DynamicJaxprTrace)
    assert jx.trace_of(x) is None  # a concrete array has no trace


def test_set_current_trace_is_public_and_the_one_jax_uses():
    from jax.extend.core import set_current_trace

    outer = jx.current_trace()
    with set_current_trace(outer):
        assert jx.current_trace() is outer


def test_bind_with_trace_binds_on_the_given_trace():
    out = jx.bind_with_trace(jax.lax.add_p, jx.current_trace(), (jnp.float32(1), 2.0), {})
    assert float(out) == 3.0


def test_the_tracer_protocol_helpers():
    x = jnp.arange(3.0)
    np.testing.assert_array_equal(np.asarray(jx.to_concrete_value(x)), np.asarray(x))
    assert jx.get_referent(x) is x
    assert jx.HAS_QDD is (jx.cur_qdd is not None)  # JAX 0.10 has quasi-dynamic data; 0.12 none


# ------------------------------------------------------------------ jaxprs, jit, keys, export


def test_convert_constvars_jaxpr_makes_the_constants_inputs():
    c = np.arange(3.0, dtype=np.float32)
    closed = jax.make_jaxpr(lambda x: x + c)(jnp.ones(3))
    program = jx.convert_constvars_jaxpr(closed.jaxpr)
    assert len(program.invars) == len(closed.jaxpr.constvars) + 1 and not program.constvars
    from jax.interpreters import partial_eval

    public = getattr(partial_eval, "convert_constvars_jaxpr", None)
    if public is not None:  # JAX 0.12: the public one is used
        assert jx.convert_constvars_jaxpr is public


def test_pretty_jaxpr_names_the_variables():
    closed = jax.make_jaxpr(lambda x, y: x * y + 1.0)(jnp.ones(2), jnp.ones(2))
    jaxpr = closed.jaxpr
    text = jx.pretty_jaxpr(jaxpr, {jaxpr.invars[0]: "weight", jaxpr.invars[1]: "input"})
    assert "weight" in text and "input" in text and "mul" in text


def test_jit_cache_size_counts_executables():
    f = jax.jit(lambda x: x + 1)
    before = jx.jit_cache_size(f)
    f(jnp.ones(2))
    f(jnp.ones(3))
    assert jx.jit_cache_size(f) == before + 2
    assert jx.jit_cache_size(lambda x: x) == 0


def test_prng_impl_is_what_random_wrap_takes():
    from jmodule.jit import ops

    impl = jx.prng_impl(ops.key_dtype("threefry2x32"))
    key = jax.random.key(7)
    data = jax.random.key_data(key)
    wrapped = jax.random.wrap_key_data(data, impl="threefry2x32")
    assert impl.name == "threefry2x32"
    from jax.extend.random import threefry_prng_impl

    assert impl is threefry_prng_impl
    np.testing.assert_array_equal(jax.random.key_data(wrapped), data)


def test_serialization_version_is_an_int():
    assert isinstance(jx.serialization_version(), int)


def test_geqrf_replaced_by_public_qr_raw():
    """``jnp.linalg.qr(mode="raw")`` is LAPACK's geqrf, transposed as NumPy's ``raw``."""
    x = np.random.default_rng(0).standard_normal((2, 5, 3)).astype(np.float32)
    h, tau = jnp.linalg.qr(x, mode="raw")
    assert h.shape == (2, 3, 5) and tau.shape == (2, 3)
    for b in range(2):
        want_h, want_tau = np.linalg.qr(x[b], mode="raw")
        np.testing.assert_allclose(np.asarray(h[b]), want_h, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(tau[b]), want_tau, rtol=1e-4, atol=1e-5)


def test_inconclusive_dimension_errors_are_the_public_class():
    (a,) = jax.export.symbolic_shape("a")
    spec = jax.ShapeDtypeStruct((a,), jnp.float32)
    with pytest.raises(jax.errors.InconclusiveDimensionOperation):
        jax.eval_shape(lambda x: x[:3] if x.shape[0] >= 3 else x, spec)


# ------------------------------------------------------------------ JAX's error texts


def _error(fn):
    try:
        fn()
    except Exception as e:  # the error JAX raises, whatever its class
        return e
    raise AssertionError("JAX raised nothing")


def test_the_deleted_array_text_matches_jaxs_error():
    x = jnp.ones(3)
    x.delete()
    error = _error(lambda: x + 1)
    assert isinstance(error, RuntimeError) and jx.is_deleted_array_error(error)
    assert not jx.is_deleted_array_error(RuntimeError("something else"))


def test_the_donation_text_matches_jaxs_error():
    f = jax.jit(lambda a, b: (a + 1, b + 1), donate_argnums=(0, 1))
    x = jnp.ones(3)
    error = _error(lambda: f(x, x))  # one buffer donated twice
    assert isinstance(error, jax.errors.JaxRuntimeError) and jx.is_donation_error(error)
    assert not jx.is_donation_error(jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: oom"))


def test_the_backend_started_text_matches_jaxs_error():
    jax.devices()  # the backend has started (it has in this process anyway)
    error = _error(lambda: jax.distributed.initialize("127.0.0.1:1", 1, 0))
    assert isinstance(error, RuntimeError) and jx.is_backend_started_error(error)


@functools.cache
def _two_device_error() -> tuple[str, str]:
    code = (
        "import jax, jax.numpy as jnp\n"
        "a, b = (jax.device_put(jnp.ones(3), d) for d in jax.devices()[:2])\n"
        "try:\n"
        "    jax.jit(lambda a, b: a + b)(a, b)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__)\n"
        "    print(str(e).replace(chr(10), ' '))\n"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count=2".strip()
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    kind, text = out.stdout.strip().splitlines()[-2:]
    return kind, text


@pytest.mark.slow
def test_the_incompatible_devices_text_matches_jaxs_error():
    kind, text = _two_device_error()
    assert kind == "ValueError"
    assert jx.is_incompatible_devices_error(ValueError(text)), text
