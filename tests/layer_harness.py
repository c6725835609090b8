"""Shared checks of a jmodule layer against the same PyTorch layer, run live.

In the spirit of PyTorch's ``common_modules.py`` / ``test_modules.py``: each
layer is described once as a :class:`LayerCase` (constructor arguments and
example inputs), and the same checks run over every case:

* ``check_state_dict``: same keys, order, shapes and dtypes;
* ``check_repr``: same ``repr`` text;
* ``check_forward``: PyTorch's weights loaded unchanged, same outputs
  (train and eval modes);
* ``check_grads``: same input and parameter gradients for a random cotangent;
* ``check_compiled``: ``model.compile()`` gives the eager output;
* ``check_low_precision``: runs in bfloat16/float16 close to float32 PyTorch;
* ``check_init``: default-initialisation statistics like PyTorch's.

A registry file lists cases; a test module parametrises these checks over it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from _torch import torch

import jmodule as jm

Inputs = Callable[[np.random.Generator], tuple]


@dataclass
class LayerCase:
    """One layer configuration, built identically in PyTorch and jmodule.

    Attributes:
        name: the class name in both ``torch.nn`` and ``jm.nn``.
        args: positional constructor arguments.
        kwargs: keyword constructor arguments.
        inputs: ``rng -> tuple`` of numpy example inputs (positional).
        call_kwargs: keyword arguments of the forward call (numpy or plain).
        rtol, atol: float32 tolerances for outputs and gradients.
        random: the forward draws random numbers (dropout-like): outputs are
            compared in eval mode only.
        grad_inputs: indices of the inputs to differentiate (float inputs).
        low_precision_tol: relative tolerance (of the output's scale) for
            bfloat16/float16 runs, or None to skip that dtype check.
        id: pytest id (defaults to name plus arguments).
        make: ``nn -> module``, building the layer from a framework's ``nn``
            namespace (``torch.nn`` or ``jm.nn``) when positional/keyword
            arguments cannot describe it (containers of layers, e.g.
            ``TransformerEncoder(TransformerEncoderLayer(...), 2)``).
        checks: names of the checks (keys of ``ALL_CHECKS``) to run for this
            case; None runs them all. For layers where a check does not apply
            (no parameters to initialise, gradients PyTorch defines
            differently), with the reason next to the case.
    """

    name: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    inputs: Inputs = lambda rng: (rng.standard_normal((2, 3)).astype(np.float32),)
    call_kwargs: dict = field(default_factory=dict)
    rtol: float = 1e-5
    atol: float = 1e-5
    random: bool = False
    grad_inputs: Sequence[int] | None = None
    low_precision_tol: float | None = 0.05
    id: str | None = None
    make: Callable[[Any], Any] | None = None
    checks: Sequence[str] | None = None

    def __post_init__(self) -> None:
        if self.id is None:
            parts = [repr(a) for a in self.args] + [f"{k}={v!r}" for k, v in self.kwargs.items()]
            self.id = f"{self.name}({', '.join(parts)})"

    def construct(self) -> tuple[torch.nn.Module, jm.nn.Module]:
        """Both modules, each freshly initialised by its own framework (no reseeding)."""
        if self.make is not None:
            return self.make(torch.nn), self.make(jm.nn)
        ref = getattr(torch.nn, self.name)(*self.args, **self.kwargs)
        ours = getattr(jm.nn, self.name)(*_jm_args(self.args), **_jm_args(self.kwargs))
        return ref, ours

    def build(self) -> tuple[torch.nn.Module, jm.nn.Module]:
        """Both modules, the jmodule one holding PyTorch's weights."""
        torch.manual_seed(0)
        ref, ours = self.construct()
        ours.load_state_dict(ref.state_dict())
        return ref, ours

    def example(self, seed: int = 0) -> tuple:
        return self.inputs(np.random.default_rng(seed))


def _jm_args(value: Any) -> Any:
    """Constructor arguments with torch dtypes/modules mapped to jmodule's."""
    if isinstance(value, tuple):
        return tuple(_jm_args(v) for v in value)
    if isinstance(value, list):
        return [_jm_args(v) for v in value]
    if isinstance(value, dict):
        return {k: _jm_args(v) for k, v in value.items()}
    if isinstance(value, torch.dtype):
        return jnp.dtype(str(value).replace("torch.", ""))
    if isinstance(value, torch.nn.Module):
        return getattr(jm.nn, type(value).__name__)()
    if isinstance(value, torch.Tensor):
        return jnp.asarray(value.detach().numpy())
    name = getattr(value, "__name__", None)
    if callable(value) and name and getattr(torch.nn.functional, name, None) is value:
        return getattr(jm.nn.functional, name)  # e.g. activation=F.gelu
    return value


def to_torch(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.array(x))
    if isinstance(x, tuple):  # e.g. an LSTM's (h0, c0)
        return tuple(to_torch(v) for v in x)
    return x


def to_jax(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return jnp.asarray(x)
    if isinstance(x, tuple):
        return tuple(to_jax(v) for v in x)
    return x


def flat_torch(out: Any) -> list[np.ndarray]:
    leaves = torch.utils._pytree.tree_leaves(out)
    return [t.detach().float().numpy() for t in leaves if isinstance(t, torch.Tensor)]


def flat_jax(out: Any) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.float32) for x in jax.tree.leaves(out)]


def assert_close(got: list, want: list, rtol: float, atol: float, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs vs PyTorch's {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape, f"{what}[{i}]: shape {g.shape} vs PyTorch's {w.shape}"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what}[{i}]")


def run_torch(ref: torch.nn.Module, case: LayerCase, inputs: tuple) -> Any:
    kwargs = {k: to_torch(v) for k, v in case.call_kwargs.items()}
    return ref(*[to_torch(x) for x in inputs], **kwargs)


def run_jm(ours: jm.nn.Module, case: LayerCase, inputs: tuple) -> Any:
    kwargs = {k: to_jax(v) for k, v in case.call_kwargs.items()}
    return ours(*[to_jax(x) for x in inputs], **kwargs)


# ----------------------------------------------------------------------------- checks


def check_state_dict(case: LayerCase) -> None:
    ref, ours = case.build()
    want = [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    got = [(k, tuple(v.shape)) for k, v in ours.state_dict().items()]
    assert got == want
    for (k, v), w in zip(ours.state_dict().items(), ref.state_dict().values()):
        expected = str(w.dtype).replace("torch.", "").replace("int64", "int32")
        assert str(v.dtype) == expected, k


def check_repr(case: LayerCase) -> None:
    ref, ours = case.build()
    assert repr(ours) == repr(ref)


def check_forward(case: LayerCase) -> None:
    ref, ours = case.build()
    modes = [False] if case.random else [True, False]
    for training in modes:
        ref.train(training)
        ours.train(training)
        for seed in range(2):  # twice: running statistics must keep matching
            inputs = case.example(seed)
            with torch.no_grad():
                want = flat_torch(run_torch(ref, case, inputs))
            got = flat_jax(run_jm(ours, case, inputs))
            assert_close(got, want, case.rtol, case.atol, f"output (training={training})")
        for k, v in ref.state_dict().items():
            np.testing.assert_allclose(
                np.asarray(ours.state_dict()[k], np.float64),
                v.double().numpy(),
                rtol=case.rtol,
                atol=case.atol,
                err_msg=f"state {k} after forward (training={training})",
            )


def _float_inputs(case: LayerCase, inputs: tuple) -> list[int]:
    if case.grad_inputs is not None:
        return list(case.grad_inputs)
    return [i for i, x in enumerate(inputs) if np.issubdtype(np.asarray(x).dtype, np.floating)]


def check_grads(case: LayerCase) -> None:
    ref, ours = case.build()
    if case.random:
        ref.eval()
        ours.eval()
    inputs = case.example(0)
    diff_idx = _float_inputs(case, inputs)
    t_inputs = [to_torch(x) for x in inputs]
    leaves = {i: t_inputs[i].clone().requires_grad_(True) for i in diff_idx}
    # Pass non-leaf copies so in-place layers (inplace=True) are differentiable.
    call_inputs = [leaves[i] * 1 if i in leaves else t for i, t in enumerate(t_inputs)]
    kwargs = {k: to_torch(v) for k, v in case.call_kwargs.items()}
    t_out = torch.utils._pytree.tree_leaves(ref(*call_inputs, **kwargs))
    t_out = [t for t in t_out if isinstance(t, torch.Tensor) and t.is_floating_point()]
    rng = np.random.default_rng(1)
    cots = [rng.standard_normal(tuple(t.shape)).astype(np.float32) for t in t_out]
    loss = sum((t * torch.from_numpy(c)).sum() for t, c in zip(t_out, cots))
    loss.backward()
    want_params = {k: p.grad.numpy() for k, p in ref.named_parameters() if p.grad is not None}
    want_inputs = [leaves[i].grad.numpy() for i in diff_idx]

    params = {k: p.data for k, p in ours.named_parameters() if p.requires_grad}
    j_inputs = [to_jax(x) for x in inputs]
    j_kwargs = {k: to_jax(v) for k, v in case.call_kwargs.items()}

    def loss_fn(params: dict, diff: list) -> jax.Array:
        args = list(j_inputs)
        for i, v in zip(diff_idx, diff):
            args[i] = v
        out = jm.func.functional_call(ours, params, tuple(args), j_kwargs)
        outs = [o for o in jax.tree.leaves(out) if jnp.issubdtype(o.dtype, jnp.floating)]
        return sum((o * jnp.asarray(c)).sum() for o, c in zip(outs, cots))

    diff_inputs = [j_inputs[i] for i in diff_idx]
    g_params, g_inputs = jax.grad(loss_fn, argnums=(0, 1))(params, diff_inputs)
    # Gradients inside compiled code (jit of grad) must work and agree with eager ones.
    g_jit = jax.jit(jax.grad(loss_fn, argnums=(0, 1)))(params, diff_inputs)
    for got, want in zip(jax.tree.leaves(g_jit), jax.tree.leaves((g_params, g_inputs))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    for k, w in want_params.items():
        np.testing.assert_allclose(
            np.asarray(g_params[k]), w, rtol=case.rtol * 10, atol=case.atol * 10, err_msg=k
        )
    assert_close(
        [np.asarray(g) for g in g_inputs], want_inputs, case.rtol * 10, case.atol * 10, "dinput"
    )


def check_compiled(case: LayerCase) -> None:
    _, ours = case.build()
    compiled = copy.deepcopy(ours)
    compiled.compile()
    if case.random:
        ours.eval()
        compiled.eval()
    for seed in range(2):
        inputs = case.example(seed)
        jm.manual_seed(seed)
        want = flat_jax(run_jm(ours, case, inputs))
        jm.manual_seed(seed)
        got = flat_jax(run_jm(compiled, case, inputs))
        assert_close(got, want, 1e-5, 1e-6, "compiled vs eager")


def check_low_precision(case: LayerCase, dtype: Any) -> None:
    if case.low_precision_tol is None:
        return
    ref, ours = case.build()
    ref.eval()
    ours.eval()
    ours.to(dtype)
    inputs = case.example(0)
    with torch.no_grad():
        want = flat_torch(run_torch(ref, case, inputs))
    low = tuple(
        x.astype(dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else x for x in inputs
    )
    out = run_jm(ours, case, low)
    for o in jax.tree.leaves(out):
        if jnp.issubdtype(o.dtype, jnp.floating):
            assert o.dtype == dtype, f"output dtype {o.dtype}, expected {dtype}"
    got = flat_jax(out)
    for g, w in zip(got, want):
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(g, w, atol=case.low_precision_tol * scale, rtol=0)


def check_init(case: LayerCase, min_size: int = 64) -> None:
    """Default-init statistics (mean/std/range of each parameter) match PyTorch's.

    Parameters smaller than ``min_size`` (a bias of a few elements) are
    pooled over several fresh constructions on both sides until there are at
    least ``4 * min_size`` samples (at most 64 constructions), so their statistics
    mean something.
    """
    torch.manual_seed(0)

    def build() -> tuple[dict, dict]:
        ref, ours = case.construct()
        want = {k: w.detach().double().numpy().ravel() for k, w in ref.named_parameters()}
        got = {k: np.asarray(g, np.float64).ravel() for k, g in ours.named_parameters()}
        return want, got

    want, got = build()
    assert list(got) == list(want)
    smallest = min((w.size for w in want.values()), default=min_size)
    rounds = 1 if smallest >= min_size else min(64, -(-4 * min_size // max(smallest, 1)))
    pools = [([w], [got[k]]) for k, w in want.items()]
    for _ in range(rounds - 1):
        more_want, more_got = build()
        for (ws, gs), k in zip(pools, want):
            ws.append(more_want[k])
            gs.append(more_got[k])
    for k, (ws, gs) in zip(want, pools):
        w, g = np.concatenate(ws), np.concatenate(gs)
        if w.std() == 0:  # a constant fill (ones, zeros, PReLU's 0.25)
            np.testing.assert_allclose(g, w, err_msg=k)
            continue
        spread = w.std()
        slack = max(0.15, 4 / np.sqrt(w.size))  # about 4 standard errors of the difference
        np.testing.assert_allclose(g.mean(), w.mean(), atol=slack * spread + 1e-6, err_msg=k)
        np.testing.assert_allclose(g.std(), w.std(), rtol=slack, atol=1e-6, err_msg=k)
        np.testing.assert_allclose(
            np.abs(g).max(), np.abs(w).max(), rtol=0.35, atol=1e-6, err_msg=k
        )


ALL_CHECKS = {
    "state_dict": check_state_dict,
    "repr": check_repr,
    "forward": check_forward,
    "grads": check_grads,
    "compiled": check_compiled,
    "bfloat16": lambda case: check_low_precision(case, jnp.bfloat16),
    "float16": lambda case: check_low_precision(case, jnp.float16),
    "init": check_init,
}


def parametrize(cases: Sequence[LayerCase]) -> tuple[list, list]:
    """``(argvalues, ids)`` for ``pytest.mark.parametrize(("check", "case"), ...)``."""
    values, ids = [], []
    for case in cases:
        for check_name in ALL_CHECKS if case.checks is None else case.checks:
            values.append((check_name, case))
            ids.append(f"{check_name}-{case.id}")
    return values, ids
