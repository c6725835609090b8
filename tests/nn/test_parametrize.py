"""``jm.nn.utils.parametrize`` / ``parametrizations`` and the old-style ``weight_norm`` /
``spectral_norm`` against ``torch.nn.utils`` live.

Each case builds the same module in both frameworks, parametrizes it the same
way and loads torch's ``state_dict()`` into jmodule (random draws at
registration, spectral norm's ``_u``/``_v`` and orthogonal's ``base``, come
from each framework's own generator); then compares state-dict keys and
values, the parametrized tensor, outputs, gradients, buffer updates, errors,
and 10 SGD steps in float64, eagerly and in a ``jm.compile``d step.
"""

from __future__ import annotations

import copy
import pickle
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_ref import normalize

import jmodule as jm
from jmodule.nn.utils import parametrize as P

pytestmark = pytest.mark.torch

RNG = np.random.default_rng(0)


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x.data if isinstance(x, jm.nn.Parameter) else x)


def _close(j, t, rtol=1e-5, atol=1e-6, msg=""):
    np.testing.assert_allclose(_np(j), _np(t), rtol=rtol, atol=atol, err_msg=msg)


def _to_torch(state):
    return {k: torch.from_numpy(np.array(v)) for k, v in state.items()}


def _assert_same_state(j, t, rtol=1e-6, atol=1e-7):
    ts, js = t.state_dict(), j.state_dict()
    assert list(js) == list(ts)
    for k in ts:
        _close(js[k], ts[k], rtol, atol, msg=k)


def _error(fn):
    with pytest.raises(Exception) as info:
        fn()
    return type(info.value).__name__, normalize(str(info.value))


def _errors(make):
    """``(torch's (type, message), jmodule's)`` for ``make(torch_namespace)``."""
    return _error(lambda: make(torch)), _error(lambda: make(jm))


# ------------------------------------------------------------------ parametrizations
# The same parametrization classes for both frameworks: ``ns`` is ``torch`` or ``jm``.


def _xp(ns):
    return torch if ns is torch else jnp


def _symmetric(ns):
    xp = _xp(ns)

    class Symmetric(ns.nn.Module):
        def forward(self, X):
            return xp.triu(X) + xp.triu(X, 1).T

    return Symmetric()


def _scale(ns, factor=2.0):
    class Scale(ns.nn.Module):
        def forward(self, X):
            return factor * X

        def right_inverse(self, X):
            return X / factor

    return Scale()


def _rank_one(ns):
    """PyTorch's documentation example: ``right_inverse`` returns two tensors."""

    class RankOne(ns.nn.Module):
        def forward(self, x, y):
            return x[..., :, None] @ y[..., None, :]

        def right_inverse(self, Z):
            if ns is torch:
                U, S, Vh = torch.linalg.svd(Z, full_matrices=False)
            else:
                U, S, Vh = jnp.linalg.svd(jm.nn.utils.parametrizations._array(Z), False)
            s0 = S[0] ** 0.5
            return U[..., :, 0] * s0, Vh[..., 0, :] * s0

    return RankOne()


def _linear(ns, i=3, o=4, seed=0, dtype=None):
    """``Linear(i, o)`` with the same weights in both frameworks."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((o, i)).astype(dtype or "float32")
    b = rng.standard_normal(o).astype(dtype or "float32")
    m = ns.nn.Linear(i, o)
    if dtype == "float64":
        m = m.double()
    if ns is torch:
        m.load_state_dict({"weight": torch.from_numpy(w), "bias": torch.from_numpy(b)})
    else:
        m.load_state_dict({"weight": w, "bias": b})
    return m


@pytest.mark.parametrize(
    "name, make",
    [
        ("symmetric", lambda ns: [_symmetric(ns)]),
        ("scale", lambda ns: [_scale(ns)]),
        ("stacked", lambda ns: [_scale(ns), _symmetric(ns), _scale(ns, 0.5)]),
        ("rank_one", lambda ns: [_rank_one(ns)]),
    ],
)
def test_register_parametrization_matches_torch(name, make):
    t, j = _linear(torch, 4, 4), _linear(jm, 4, 4)
    for pt, pj in zip(make(torch), make(jm)):
        torch.nn.utils.parametrize.register_parametrization(t, "weight", pt)
        P.register_parametrization(j, "weight", pj)
    assert type(j).__name__ == type(t).__name__ == "ParametrizedLinear"
    assert P.type_before_parametrizations(j) is jm.nn.Linear
    assert P.is_parametrized(j) and P.is_parametrized(j, "weight")
    assert not P.is_parametrized(j, "bias")
    assert isinstance(j.parametrizations.weight, P.ParametrizationList)
    assert len(j.parametrizations.weight) == len(t.parametrizations.weight)
    assert [n for n, _ in j.named_parameters()] == [n for n, _ in t.named_parameters()]
    _assert_same_state(j, t, rtol=1e-5, atol=1e-6)
    _close(j.weight, t.weight, msg="weight")
    x = RNG.standard_normal((2, 4)).astype("float32")
    _close(j(jnp.asarray(x)), t(torch.from_numpy(x)))
    assert repr(j) == repr(t).replace("torch.nn", "jm.nn")


def test_several_originals_are_named_original0_original1():
    t = torch.nn.utils.parametrize.register_parametrization(
        _linear(torch, 4, 4), "weight", _rank_one(torch)
    )
    j = P.register_parametrization(_linear(jm, 4, 4), "weight", _rank_one(jm))
    keys = ["bias", "parametrizations.weight.original0", "parametrizations.weight.original1"]
    assert list(j.state_dict()) == list(t.state_dict()) == keys
    assert j.parametrizations.weight.ntensors == 2 and not j.parametrizations.weight.is_tensor
    _close(j.weight, t.weight, 1e-5, 1e-5)
    assert np.linalg.matrix_rank(_np(j.weight)) == 1  # the outer product of the originals


def test_gradients_reach_original_eager_and_compiled():
    t = torch.nn.utils.parametrize.register_parametrization(
        _linear(torch), "weight", _scale(torch, 3.0)
    )
    x = RNG.standard_normal((5, 3)).astype("float32")
    (t(torch.from_numpy(x)) ** 2).sum().backward()
    for compiled in (False, True):
        j = P.register_parametrization(_linear(jm), "weight", _scale(jm, 3.0))

        def grads(model, x):
            model.zero_grad()
            loss = jm.backward(lambda: (model(x) ** 2).sum())
            return loss, model.parametrizations.weight.original.grad, model.bias.grad

        run = jm.compile(grads) if compiled else grads
        _, g_orig, g_bias = run(j, jnp.asarray(x))
        _close(g_orig, t.parametrizations.weight.original.grad, 1e-5, 1e-5)
        _close(g_bias, t.bias.grad, 1e-5, 1e-5)


def test_optimizer_made_before_registration_trains_original():
    """``original`` is the same Parameter object (PyTorch's ``set_``), so an optimizer
    built from ``model.parameters()`` before registering still trains it."""
    x = RNG.standard_normal((4, 3)).astype("float32")
    t = _linear(torch)
    t_opt = torch.optim.SGD(t.parameters(), lr=0.1)
    torch.nn.utils.parametrize.register_parametrization(t, "weight", _scale(torch))
    j = _linear(jm)
    weight = j.weight
    j_opt = jm.optim.SGD(j.parameters(), lr=0.1)
    P.register_parametrization(j, "weight", _scale(jm))
    assert j.parametrizations.weight.original is weight
    t_opt.zero_grad()
    t(torch.from_numpy(x)).sum().backward()
    t_opt.step()

    @jm.compile
    def step(model, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: model(x).sum())
        opt.step()
        return loss

    step(j, j_opt, jnp.asarray(x))
    _assert_same_state(j, t, 1e-5, 1e-6)


def test_assigning_the_parametrized_tensor_runs_right_inverse():
    value = RNG.standard_normal((4, 3)).astype("float32")
    t = torch.nn.utils.parametrize.register_parametrization(_linear(torch), "weight", _scale(torch))
    with torch.no_grad():
        t.weight = torch.from_numpy(value)
    j = P.register_parametrization(_linear(jm), "weight", _scale(jm))
    j.weight = jnp.asarray(value)
    _assert_same_state(j, t)
    _close(j.weight, value)

    @jm.compile
    def assign(model, v):  # inside a program: an update of the program's state
        model.weight = v
        return model.weight

    out = assign(j, jnp.asarray(2 * value))
    _close(out, 2 * value)
    _close(j.parametrizations.weight.original, value)  # right_inverse: / 2
    _close(assign(j, jnp.asarray(value)), value)
    assert jm.compile_stats(assign).num_traces == 1  # the setter changes no structure
    # A parametrization without right_inverse cannot be assigned (as torch)
    j2 = P.register_parametrization(_linear(jm, 3, 3), "weight", _symmetric(jm))
    t2 = torch.nn.utils.parametrize.register_parametrization(
        _linear(torch, 3, 3), "weight", _symmetric(torch)
    )

    def set_t():
        with torch.no_grad():
            t2.weight = torch.zeros(3, 3)

    def set_j():
        j2.weight = jnp.zeros((3, 3))

    assert _error(set_t) == _error(set_j)


def test_compiled_program_recomputes_the_parametrized_weight():
    j = P.register_parametrization(_linear(jm), "weight", _scale(jm))
    fwd = jm.compile(lambda model: model.weight)
    first = np.array(fwd(j))
    new = RNG.standard_normal((4, 3)).astype("float32")
    j.parametrizations.weight.original.data = jnp.asarray(new)
    _close(fwd(j), 2 * new)  # not the first call's value
    assert not np.allclose(first, 2 * new)
    j.compile()
    x = jnp.ones((1, 3))
    _close(j(x), x @ (2 * new).T + np.asarray(j.bias.data))


# ------------------------------------------------------------------ removing


@pytest.mark.parametrize("leave", [True, False])
@pytest.mark.parametrize("kind", ["scale", "rank_one"])
def test_remove_parametrizations_matches_torch(leave, kind):
    make = _scale if kind == "scale" else _rank_one

    def run(ns):
        m = _linear(ns, 4, 4)
        original = m.weight
        reg = (torch.nn.utils.parametrize if ns is torch else P).register_parametrization
        reg(m, "weight", make(ns))
        remove = (torch.nn.utils.parametrize if ns is torch else P).remove_parametrizations
        remove(m, "weight", leave_parametrized=leave)
        return m, original

    if kind == "rank_one" and not leave:
        assert _error(lambda: run(torch)) == _error(lambda: run(jm))
        return
    (t, t_orig), (j, j_orig) = run(torch), run(jm)
    assert type(j) is jm.nn.Linear and type(t) is torch.nn.Linear
    assert not hasattr(j, "parametrizations")
    assert (j.weight is j_orig) == (t.weight is t_orig)  # same Parameter object kept
    assert isinstance(j.weight, jm.nn.Parameter)
    _assert_same_state(j, t, 1e-5, 1e-6)


def test_unsafe_allows_a_shape_change_as_torch():
    def run(ns):
        m = _reg(ns).register_parametrization(
            _linear(ns), "weight", _shape_changer(ns), unsafe=True
        )
        return m.weight, m.parametrizations.weight.unsafe

    (t_w, t_unsafe), (j_w, j_unsafe) = run(torch), run(jm)
    assert tuple(j_w.shape) == tuple(t_w.shape) == (12,) and j_unsafe is t_unsafe is True
    _close(j_w, t_w)


def test_buffer_parametrization_matches_torch():
    """A buffer is parametrized as a buffer: ``original`` is a buffer, not a parameter."""

    def run(ns):
        m = ns.nn.BatchNorm1d(3).eval()
        _reg(ns).register_parametrization(m, "running_var", _scale(ns))
        x = np.random.default_rng(2).standard_normal((4, 3)).astype("float32")
        out = m(torch.from_numpy(x) if ns is torch else jnp.asarray(x))
        names = ([n for n, _ in m.named_buffers()], [n for n, _ in m.named_parameters()])
        _reg(ns).remove_parametrizations(m, "running_var")
        return m, out, names

    (t, t_out, t_names), (j, j_out, j_names) = run(torch), run(jm)
    assert j_names == t_names
    assert "parametrizations.running_var.original" in j_names[0]
    _close(j_out, t_out)
    _assert_same_state(j, t)
    assert "running_var" in j._buffers


def test_transfer_parametrizations_and_params_matches_torch():
    def run(ns):
        src = _reg(ns).register_parametrization(_linear(ns), "weight", _scale(ns))
        dst = _linear(ns, seed=5)
        _reg(ns).transfer_parametrizations_and_params(src, dst)
        return src, dst

    (t_src, t_dst), (j_src, j_dst) = run(torch), run(jm)
    assert type(j_dst).__name__ == "ParametrizedLinear"
    shared = t_dst.parametrizations.weight.original is t_src.parametrizations.weight.original
    assert shared  # torch's: the same Parameter object
    assert j_dst.parametrizations.weight.original is j_src.parametrizations.weight.original
    _assert_same_state(j_dst, t_dst)


@pytest.mark.slow
def test_orthogonal_complex_matches_torch():
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((3, 3)) + 1j * rng.standard_normal((3, 3))).astype("complex64")
    for omap in (None, "cayley"):

        def build(ns, omap=omap):
            m = ns.nn.Module()
            m.w = ns.nn.Parameter(torch.from_numpy(w.copy()) if ns is torch else jnp.asarray(w))
            return ns.nn.utils.parametrizations.orthogonal(m, "w", omap)

        t, j = build(torch), build(jm)
        _assert_same_state(j, t, 1e-5, 1e-6)
        _close(j.w, t.w, 1e-5, 1e-6)


def test_remove_one_of_two_parametrized_tensors_keeps_the_class():
    for ns, mod in ((torch, torch.nn.utils.parametrize), (jm, P)):
        m = _linear(ns)
        mod.register_parametrization(m, "weight", _scale(ns))
        mod.register_parametrization(m, "bias", _scale(ns))
        mod.remove_parametrizations(m, "weight")
        assert type(m).__name__ == "ParametrizedLinear"
        assert list(m.state_dict()) == ["weight", "parametrizations.bias.original"]
        mod.remove_parametrizations(m, "bias", leave_parametrized=False)
        assert type(m).__name__ == "Linear"


# ------------------------------------------------------------------ errors


def _reg(ns):
    return torch.nn.utils.parametrize if ns is torch else P


def _shape_changer(ns):
    class Flat(ns.nn.Module):
        def forward(self, X):
            return X.reshape(-1)

    return Flat()


def _dtype_changer(ns):
    class Half(ns.nn.Module):
        def forward(self, X):
            return (
                X.half()
                if ns is torch
                else jm.nn.utils.parametrizations._array(X).astype(jnp.float16)
            )

    return Half()


def _returns_list(ns):
    class NotTensor(ns.nn.Module):
        def forward(self, X):
            return X

        def right_inverse(self, X):
            return 3

    return NotTensor()


ERRORS = {
    "not_a_tensor": lambda ns: _reg(ns).register_parametrization(
        ns.nn.Linear(2, 2), "nope", _scale(ns)
    ),
    "remove_not_parametrized": lambda ns: _reg(ns).remove_parametrizations(
        ns.nn.Linear(2, 2), "weight"
    ),
    "shape_change": lambda ns: _reg(ns).register_parametrization(
        ns.nn.Linear(2, 2), "weight", _shape_changer(ns)
    ),
    "dtype_change": lambda ns: _reg(ns).register_parametrization(
        ns.nn.Linear(2, 2), "weight", _dtype_changer(ns)
    ),
    "right_inverse_not_tensor": lambda ns: _reg(ns).register_parametrization(
        ns.nn.Linear(2, 2), "weight", _returns_list(ns)
    ),
    "stacked_shape_change": lambda ns: _reg(ns).register_parametrization(
        _reg(ns).register_parametrization(ns.nn.Linear(2, 2), "weight", _scale(ns)),
        "weight",
        _shape_changer(ns),
    ),
    "orthogonal_1d": lambda ns: ns.nn.utils.parametrizations.orthogonal(ns.nn.Linear(2, 2), "bias"),
    "orthogonal_missing": lambda ns: ns.nn.utils.parametrizations.orthogonal(
        ns.nn.Linear(2, 2), "nope"
    ),
    "orthogonal_map": lambda ns: ns.nn.utils.parametrizations.orthogonal(
        ns.nn.Linear(2, 2), orthogonal_map="qr"
    ),
    "orthogonal_assign_matrix_exp": lambda ns: setattr(
        ns.nn.utils.parametrizations.orthogonal(
            ns.nn.Linear(2, 2), orthogonal_map="matrix_exp", use_trivialization=False
        ),
        "weight",
        ns.eye(2) if ns is torch else jnp.eye(2),
    ),
    "spectral_iterations": lambda ns: ns.nn.utils.parametrizations.spectral_norm(
        ns.nn.Linear(2, 2), n_power_iterations=0
    ),
    "spectral_dim": lambda ns: ns.nn.utils.parametrizations.spectral_norm(
        ns.nn.Linear(2, 2), dim=2
    ),
    "spectral_missing": lambda ns: ns.nn.utils.parametrizations.spectral_norm(
        ns.nn.Linear(2, 2), "nope"
    ),
    "old_weight_norm_twice": lambda ns: ns.nn.utils.weight_norm(
        ns.nn.utils.weight_norm(ns.nn.Linear(2, 2))
    ),
    "old_remove_weight_norm": lambda ns: ns.nn.utils.remove_weight_norm(ns.nn.Linear(2, 2)),
    "old_spectral_norm_twice": lambda ns: ns.nn.utils.spectral_norm(
        ns.nn.utils.spectral_norm(ns.nn.Linear(2, 2))
    ),
    "old_spectral_iterations": lambda ns: ns.nn.utils.spectral_norm(
        ns.nn.Linear(2, 2), n_power_iterations=0
    ),
    "old_remove_spectral_norm": lambda ns: ns.nn.utils.remove_spectral_norm(ns.nn.Linear(2, 2)),
    "old_spectral_none": lambda ns: ns.nn.utils.spectral_norm(
        ns.nn.Linear(2, 2, bias=False), "bias"
    ),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_errors_match_torch(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        t_err, j_err = _errors(ERRORS[case])
    assert j_err[0] == t_err[0]
    expected = t_err[1].replace("torch.nn.utils", "jm.nn.utils").replace("torch.float", "float")
    assert j_err[1] == expected


def test_serialization_only_through_state_dict():
    for ns in (torch, jm):
        m = ns.nn.utils.parametrizations.weight_norm(ns.nn.Linear(2, 2))
        with pytest.raises(RuntimeError, match="only supported through state_dict"):
            pickle.dumps(m)
    j = jm.nn.utils.parametrizations.weight_norm(_linear(jm))
    c = copy.deepcopy(j)
    assert type(c) is type(j) and c.parametrizations.weight is not j.parametrizations.weight
    _close(c.weight, j.weight)


# ------------------------------------------------------------------ cached


@pytest.mark.slow
def test_cached_computes_once_eager_and_compiled():
    """Under ``cached()`` a spectral-norm weight read twice runs one power iteration, as
    torch's; without it two. Eagerly, inside a compiled function, and a ``cached()``
    around a compiled call raises (a program cannot carry a value between calls)."""
    t = torch.nn.utils.parametrizations.spectral_norm(_linear(torch, 3, 4))
    with torch.no_grad():  # start vectors far from converged: each iteration shows
        t.parametrizations.weight[0]._u.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))
        t.parametrizations.weight[0]._v.copy_(torch.tensor([0.0, 1.0, 0.0]))

    def twice(m, x):
        return m(x) + m(x)

    def cached_twice(m, x):
        with P.cached():
            return twice(m, x)

    def reference(use_cache, calls):
        ref = copy.deepcopy(t)
        for _ in range(calls):
            with torch.nn.utils.parametrize.cached() if use_cache else _nothing():
                out = twice(ref, torch.from_numpy(x))
        return out, ref

    x = RNG.standard_normal((2, 3)).astype("float32")
    u_key = "parametrizations.weight.0._u"
    once, twice_ref = reference(True, 1)[1], reference(False, 1)[1]
    assert not np.allclose(_np(once.state_dict()[u_key]), _np(twice_ref.state_dict()[u_key]))
    for how in ("eager", "compiled", "around_compiled"):
        for use_cache in (False, True):
            j = jm.nn.utils.parametrizations.spectral_norm(_linear(jm, 3, 4))
            j.load_state_dict(t.state_dict())
            if how == "eager":
                with P.cached() if use_cache else _nothing():
                    out = twice(j, jnp.asarray(x))
            elif how == "compiled":
                out = jm.compile(cached_twice if use_cache else twice)(j, jnp.asarray(x))
            else:
                run = jm.compile(twice)
                with P.cached() if use_cache else _nothing():
                    if use_cache:  # a program cannot reuse values between calls
                        with pytest.raises(RuntimeError, match=r"inside the jm\.compile'd"):
                            run(j, jnp.asarray(x))
                        _assert_same_state(j, t)  # the failed trace left nothing behind
                        continue
                    out = run(j, jnp.asarray(x))
            t_out, ref = reference(use_cache, 1)
            _close(out, t_out, 1e-5, 1e-5, msg=f"{how} cached={use_cache}")
            _assert_same_state(j, ref, 1e-5, 1e-6)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def test_cached_value_is_not_reused_inside_backward():
    """A value cached outside ``jm.backward`` is recomputed inside it, so gradients flow."""
    j = P.register_parametrization(_linear(jm), "weight", _scale(jm))
    x = jnp.ones((2, 3))
    with P.cached():
        w_outside = j.weight
        loss = jm.backward(lambda: (j(x) ** 2).sum())
        assert j.weight is w_outside
    assert loss is not None and j.parametrizations.weight.original.grad is not None
    t = torch.nn.utils.parametrize.register_parametrization(_linear(torch), "weight", _scale(torch))
    with torch.nn.utils.parametrize.cached():
        (t(torch.ones(2, 3)) ** 2).sum().backward()
    _close(j.parametrizations.weight.original.grad, t.parametrizations.weight.original.grad)


# ------------------------------------------------------------------ ready-made ones

ORTHOGONAL = [
    # (in, out, map, trivialization): square, tall and wide, every map
    (4, 4, None, True),
    (4, 4, "cayley", True),
    (4, 4, "householder", True),
    (3, 5, None, True),
    (5, 3, None, True),
    (3, 5, "matrix_exp", True),
    (5, 3, "cayley", True),
    (3, 5, None, False),
    (5, 3, "householder", False),
    (4, 4, None, False),
    (4, 4, "cayley", False),
]


@pytest.mark.slow
@pytest.mark.parametrize("i, o, omap, triv", ORTHOGONAL)
def test_orthogonal_matches_torch(i, o, omap, triv):
    t = torch.nn.utils.parametrizations.orthogonal(
        _linear(torch, i, o), orthogonal_map=omap, use_trivialization=triv
    )
    j = jm.nn.utils.parametrizations.orthogonal(
        _linear(jm, i, o), orthogonal_map=omap, use_trivialization=triv
    )
    assert (
        j.parametrizations.weight[0].orthogonal_map.name
        == t.parametrizations.weight[0].orthogonal_map.name
    )
    if i == o or not triv:  # no random completion: registration itself matches
        _assert_same_state(j, t, 1e-5, 1e-5)
    j.load_state_dict(t.state_dict())
    _close(j.weight, t.weight, 1e-5, 1e-5)
    Q = _np(j.weight)
    gram = Q.T @ Q if o >= i else Q @ Q.T
    np.testing.assert_allclose(gram, np.eye(min(i, o)), atol=1e-5)
    x = RNG.standard_normal((2, i)).astype("float32")
    (t(torch.from_numpy(x)) ** 2).sum().backward()
    j.zero_grad()
    jm.backward(lambda: (j(jnp.asarray(x)) ** 2).sum())
    for (name, tp), jp in zip(t.named_parameters(), j.parameters()):
        _close(jp.grad, tp.grad, 1e-4, 1e-5, msg=name)


@pytest.mark.slow
def test_orthogonal_batched_and_assignment():
    def build(ns):
        m = ns.nn.Module()
        w = np.random.default_rng(5).standard_normal((2, 4, 3)).astype("float32")
        m.w = ns.nn.Parameter(torch.from_numpy(w) if ns is torch else jnp.asarray(w))
        return m

    for omap in ("matrix_exp", "householder", "cayley"):
        t = torch.nn.utils.parametrizations.orthogonal(build(torch), "w", omap)
        j = jm.nn.utils.parametrizations.orthogonal(build(jm), "w", omap)
        j.load_state_dict(t.state_dict())
        _close(j.w, t.w, 1e-5, 1e-5, msg=omap)
    # Assigning an orthogonal matrix to the weight (householder, no trivialization: the
    # original becomes the reflectors of its QR factorization, as torch's geqrf).
    q = np.linalg.qr(RNG.standard_normal((5, 3)))[0].astype("float32")
    t = torch.nn.utils.parametrizations.orthogonal(_linear(torch, 3, 5), use_trivialization=False)
    j = jm.nn.utils.parametrizations.orthogonal(_linear(jm, 3, 5), use_trivialization=False)
    with torch.no_grad():
        t.weight = torch.from_numpy(q)
    j.weight = jnp.asarray(q)
    _assert_same_state(j, t, 1e-5, 1e-5)
    _close(j.weight, q, 1e-5, 1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dim", [0, 1, None, -1, -2, 3])
def test_weight_norm_matches_torch(dim):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3, 2, 2)).astype("float32")

    def build(ns):
        m = ns.nn.Conv2d(3, 4, 2)
        m.weight.data = torch.from_numpy(w) if ns is torch else jnp.asarray(w)
        return ns.nn.utils.parametrizations.weight_norm(m, dim=dim)

    t, j = build(torch), build(jm)
    j.load_state_dict(t.state_dict(), strict=False)  # bias: its own init
    j.bias.data = jnp.asarray(t.bias.detach().numpy())
    _assert_same_state(j, t, 1e-6, 1e-6)
    _close(j.weight, w, 1e-5, 1e-6)
    x = rng.standard_normal((2, 3, 5, 5)).astype("float32")
    (t(torch.from_numpy(x)) ** 2).mean().backward()
    jm.backward(lambda: (j(jnp.asarray(x)) ** 2).mean())
    for (name, tp), jp in zip(t.named_parameters(), j.parameters()):
        _close(jp.grad, tp.grad, 1e-4, 1e-6, msg=name)


def test_weight_norm_loads_old_style_state_dict():
    """The new weight_norm loads an old ``weight_g``/``weight_v`` state dict (as torch)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        old = torch.nn.utils.weight_norm(_linear(torch))
    t = torch.nn.utils.parametrizations.weight_norm(_linear(torch, seed=9))
    t.load_state_dict(old.state_dict())
    j = jm.nn.utils.parametrizations.weight_norm(_linear(jm, seed=9))
    j.load_state_dict(old.state_dict())
    _assert_same_state(j, t)


@pytest.mark.slow
@pytest.mark.parametrize(
    "module, kw",
    [
        ("linear", {}),
        ("linear", {"n_power_iterations": 3, "eps": 1e-3}),
        ("conv", {}),
        ("conv", {"dim": 1}),
        ("conv_transpose", {}),
        ("bias_1d", {}),
    ],
)
def test_spectral_norm_matches_torch(module, kw):
    def build(ns):
        if module == "linear":
            m, name = _linear(ns, 3, 4), "weight"
        elif module == "conv":
            m, name = ns.nn.Conv1d(2, 3, 2), "weight"
        elif module == "conv_transpose":
            m, name = ns.nn.ConvTranspose1d(2, 3, 2), "weight"
        else:
            m, name = _linear(ns, 3, 4), "bias"
        return ns.nn.utils.parametrizations.spectral_norm(m, name, **kw), name

    (t, name), (j, _) = build(torch), build(jm)
    assert list(j.state_dict()) == list(t.state_dict())
    j.load_state_dict(t.state_dict())
    assert j.parametrizations[name][0].dim == t.parametrizations[name][0].dim
    x = RNG.standard_normal((2, 3) if module in ("linear", "bias_1d") else (2, 2, 5))
    x = x.astype("float32")
    for training in (True, False, True):
        t.train(training)
        j.train(training)
        t.zero_grad()
        j.zero_grad()
        (t(torch.from_numpy(x)) ** 2).sum().backward()
        jm.backward(lambda: (j(jnp.asarray(x)) ** 2).sum())
        _assert_same_state(j, t, 1e-5, 1e-6)  # _u/_v: updated in training mode only
        for (pname, tp), jp in zip(t.named_parameters(), j.parameters()):
            _close(jp.grad, tp.grad, 1e-4, 1e-5, msg=pname)


def test_spectral_norm_buffers_in_compiled_forward():
    t = torch.nn.utils.parametrizations.spectral_norm(_linear(torch, 3, 4))
    j = jm.nn.utils.parametrizations.spectral_norm(_linear(jm, 3, 4))
    j.load_state_dict(t.state_dict())
    j.compile()
    x = RNG.standard_normal((2, 3)).astype("float32")
    for training in (True, True, False, False, True):
        t.train(training)
        j.train(training)
        _close(j(jnp.asarray(x)), t(torch.from_numpy(x)), 1e-5, 1e-5)
        _assert_same_state(j, t, 1e-5, 1e-6)


def test_spectral_norm_registration_estimates_sigma():
    """Registration normalizes the weight (16 power iterations: 15, then the consistency
    check's one); from the same vectors the power method gives torch's numbers."""
    t = torch.nn.utils.parametrizations.spectral_norm(_linear(torch, 3, 4))
    j = jm.nn.utils.parametrizations.spectral_norm(_linear(jm, 3, 4))
    assert np.linalg.norm(_np(t.parametrizations.weight.original), 2) > 1.1
    np.testing.assert_allclose(np.linalg.norm(_np(j.weight), 2), 1.0, rtol=1e-3)
    np.testing.assert_allclose(np.linalg.norm(_np(t.weight), 2), 1.0, rtol=1e-3)
    start = {"_u": np.array([1.0, 0, 0, 0], "float32"), "_v": np.array([0, 1.0, 0], "float32")}
    ts, js = t.parametrizations.weight[0], j.parametrizations.weight[0]
    with torch.no_grad():
        for k, v in start.items():
            getattr(ts, k).copy_(torch.from_numpy(v))
        ts._power_method(t.parametrizations.weight.original, 15)
    js.load_state_dict({k: jnp.asarray(v) for k, v in start.items()})
    js._power_method(jnp.asarray(_np(j.parametrizations.weight.original)), 15)
    for k in start:
        _close(getattr(js, k), getattr(ts, k), 1e-5, 1e-6, msg=k)


# ------------------------------------------------------------------ old style


@pytest.mark.slow
@pytest.mark.parametrize("dim", [0, 1, None])
def test_old_weight_norm_matches_torch(dim):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        t = torch.nn.utils.weight_norm(_linear(torch), dim=dim)
        with pytest.warns(FutureWarning, match="deprecated"):
            j = jm.nn.utils.weight_norm(_linear(jm), dim=dim)
    _assert_same_state(j, t)
    x = RNG.standard_normal((2, 3)).astype("float32")
    (t(torch.from_numpy(x)) ** 2).sum().backward()
    jm.backward(lambda: (j(jnp.asarray(x)) ** 2).sum())
    _close(j.weight, t.weight)
    for (name, tp), jp in zip(t.named_parameters(), j.parameters()):
        _close(jp.grad, tp.grad, 1e-5, 1e-6, msg=name)
    torch.nn.utils.remove_weight_norm(t)
    jm.nn.utils.remove_weight_norm(j)
    _assert_same_state(j, t)
    assert isinstance(j.weight, jm.nn.Parameter) and not j._forward_pre_hooks


@pytest.mark.slow
def test_old_spectral_norm_matches_torch():
    t = torch.nn.utils.spectral_norm(_linear(torch, 3, 4))
    j = jm.nn.utils.spectral_norm(_linear(jm, 3, 4))
    assert list(j.state_dict()) == list(t.state_dict())
    assert j.state_dict()._metadata == t.state_dict()._metadata
    j.load_state_dict(t.state_dict())
    x = RNG.standard_normal((2, 3)).astype("float32")
    for training in (True, False, True):
        t.train(training)
        j.train(training)
        t.zero_grad()
        j.zero_grad()
        (t(torch.from_numpy(x)) ** 2).sum().backward()
        jm.backward(lambda: (j(jnp.asarray(x)) ** 2).sum())
        _close(j.weight, t.weight, 1e-5, 1e-6)
        _assert_same_state(j, t, 1e-5, 1e-6)
        for (name, tp), jp in zip(t.named_parameters(), j.parameters()):
            _close(jp.grad, tp.grad, 1e-4, 1e-5, msg=name)
    # a version-0 state dict (weight saved, no weight_v) is converted on load, as torch's
    old = dict(t.state_dict())
    old["weight"] = t.weight.detach().clone()
    del old["weight_v"]
    meta = {"": {"version": 1, "spectral_norm": {"weight.version": 0}}}
    t_old, j_old = _od(old, meta), _od(old, meta)
    t2 = torch.nn.utils.spectral_norm(_linear(torch, 3, 4, seed=3))
    j2 = jm.nn.utils.spectral_norm(_linear(jm, 3, 4, seed=3))
    t2.load_state_dict(t_old)
    j2.load_state_dict(j_old)
    _assert_same_state(j2, t2, 1e-4, 1e-5)
    torch.nn.utils.remove_spectral_norm(t)
    jm.nn.utils.remove_spectral_norm(j)
    _assert_same_state(j, t, 1e-5, 1e-6)
    assert not j._forward_pre_hooks and not j._state_dict_hooks
    assert not j._load_state_dict_pre_hooks


def _od(d, meta):
    from collections import OrderedDict

    out = OrderedDict(d)
    out._metadata = meta
    return out


@pytest.mark.slow
def test_old_style_weight_is_recomputed_on_read():
    """jmodule computes the old-style weight when read (documented difference: torch's
    attribute is refreshed by the forward pre-hook)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        j = jm.nn.utils.weight_norm(_linear(jm))
    j.weight_g.data = 2 * j.weight_g.data
    g, v = _np(j.weight_g), _np(j.weight_v)
    _close(j.weight, v * g / np.linalg.norm(v, axis=1, keepdims=True))
    fwd = jm.compile(lambda m, x: m(x))
    x = jnp.ones((1, 3))
    _close(fwd(j, x), x @ _np(j.weight).T + _np(j.bias))
    j.weight_g.data = 3 * j.weight_g.data  # not stale in the compiled program
    _close(fwd(j, x), x @ _np(j.weight).T + _np(j.bias), 1e-5, 1e-5)


def test_old_style_modules_pickle_and_copy():
    """Unlike parametrized modules, old-style ones pickle (as torch's); jmodule's also
    deep-copy (torch's weight_norm refuses: its ``weight`` attribute is a non-leaf)."""
    for ns in (torch, jm):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for apply in (ns.nn.utils.weight_norm, ns.nn.utils.spectral_norm):
                m = apply(_linear(ns)).eval()
                copies = [pickle.loads(pickle.dumps(m))]
                if ns is jm:
                    copies.append(copy.deepcopy(m))
                for c in copies:
                    assert list(c.state_dict()) == list(m.state_dict())
                    assert len(c._forward_pre_hooks) == 1
                    x = np.ones((1, 3), "float32")
                    arr = torch.from_numpy(x) if ns is torch else jnp.asarray(x)
                    _close(c(arr), m(arr))


# ------------------------------------------------------------------ training


def _parametrize(ns, kind, m):
    utils = ns.nn.utils
    if kind == "weight_norm":
        return utils.parametrizations.weight_norm(m)
    if kind == "weight_norm_dim_none":
        return utils.parametrizations.weight_norm(m, dim=None)
    if kind == "spectral_norm":
        return utils.parametrizations.spectral_norm(m)
    if kind == "orthogonal":
        return utils.parametrizations.orthogonal(m)  # tall: householder
    if kind == "orthogonal_cayley":
        return utils.parametrizations.orthogonal(m, orthogonal_map="cayley")
    if kind == "orthogonal_square":
        return utils.parametrizations.orthogonal(m)  # square: matrix_exp
    if kind == "old_weight_norm":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return utils.weight_norm(m)
    if kind == "old_spectral_norm":
        return utils.spectral_norm(m)
    raise AssertionError(kind)


KINDS = [
    "weight_norm",
    "weight_norm_dim_none",
    "spectral_norm",
    "orthogonal",
    "orthogonal_cayley",
    "orthogonal_square",
    "old_weight_norm",
    "old_spectral_norm",
]


@pytest.mark.slow
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_ten_sgd_steps_match_torch_float64(kind, compiled):
    hidden = 4 if kind == "orthogonal_square" else 6
    with jax.enable_x64(True):

        def build(ns):
            first = _parametrize(ns, kind, _linear(ns, 4, hidden, seed=2, dtype="float64"))
            last = _linear(ns, hidden, 3, seed=4, dtype="float64")
            return ns.nn.Sequential(first, ns.nn.Tanh(), last)

        t, j = build(torch), build(jm)
        j.load_state_dict(t.state_dict())
        t_opt = torch.optim.SGD(t.parameters(), lr=0.125, momentum=0.875)
        j_opt = jm.optim.SGD(j.parameters(), lr=0.125, momentum=0.875)
        rng = np.random.default_rng(3)
        data = [(rng.standard_normal((8, 4)), rng.standard_normal((8, 3))) for _ in range(10)]

        def step(model, opt, x, y):
            opt.zero_grad()
            loss = jm.backward(lambda: ((model(x) - y) ** 2).mean())
            opt.step()
            return loss

        run = jm.compile(step) if compiled else step
        start = {k: np.array(v) for k, v in j.state_dict().items()}
        for x, y in data:
            t_opt.zero_grad()
            t_loss = ((t(torch.from_numpy(x)) - torch.from_numpy(y)) ** 2).mean()
            t_loss.backward()
            t_opt.step()
            j_loss = run(j, j_opt, jnp.asarray(x), jnp.asarray(y))
            np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-10)
        if compiled:  # traced once: no structural change from step to step
            assert jm.compile_stats(run).num_traces == 1, jm.compile_stats(run).reasons
        for k, tv in t.state_dict().items():
            jv = j.state_dict()[k]
            assert np.asarray(jv).dtype == np.float64, k
            np.testing.assert_allclose(
                np.asarray(jv), tv.numpy(), rtol=1e-10, atol=1e-12, err_msg=k
            )
        moved = [k for k, v in j.state_dict().items() if not np.allclose(start[k], np.asarray(v))]
        assert any("original" in k or k.startswith("0.weight") for k in moved), moved
        if "spectral" in kind:  # the power iteration ran every step
            assert any(k.endswith(("_u", "_v")) for k in moved), moved
        # Old style: torch's ``weight`` attribute is the last forward's (see the
        # docstrings); an eval forward refreshes it without a power iteration.
        t.eval()
        j.eval()
        _close(j(jnp.asarray(x)), t(torch.from_numpy(x)), 1e-10, 1e-12)
        _close(j[0].weight, t[0].weight, 1e-10, 1e-12)


@pytest.mark.slow
def test_jmodule_state_dict_loads_into_torch():
    """And back: jmodule's state dict, trained a step, loads into torch unchanged."""
    for kind in ("weight_norm", "spectral_norm", "orthogonal", "old_spectral_norm"):
        t = _parametrize(torch, kind, _linear(torch, 4, 6))
        j = _parametrize(jm, kind, _linear(jm, 4, 6))
        opt = jm.optim.SGD(j.parameters(), lr=0.5)
        x = jnp.asarray(RNG.standard_normal((3, 4)).astype("float32"))
        jm.backward(lambda: (j(x) ** 2).sum())
        opt.step()
        t.load_state_dict(_to_torch(j.state_dict()))
        _assert_same_state(j, t, 0, 0)
        t.eval()
        j.eval()
        _close(j(x), t(torch.from_numpy(np.array(x))), 1e-5, 1e-5, msg=kind)
