"""``LBFGS``: PyTorch's L-BFGS, with its optional strong-Wolfe line search.

This is PyTorch's algorithm step for step (``torch/optim/lbfgs.py``), not
``optax.lbfgs``: optax's keeps a fixed-size ring-buffer history, scales the
first direction differently, takes one update per ``update`` call and runs
its zoom line search on a value-and-gradient function, so its iterates are
not PyTorch's. PyTorch's ``step(closure)`` is a whole inner loop: up to
``max_iter`` iterations and ``max_eval`` closure evaluations, stopping when
the gradient, the step or the loss change falls below a tolerance, with the
history of ``history_size`` curvature pairs and (``line_search_fn=
"strong_wolfe"``) a bracketing/zoom line search that chooses each trial step
from the previous losses and gradients.

JAX limit: those stopping rules and the line search's choices are Python
control flow on loss and gradient *values*, and each closure evaluation
sets ``.grad`` as it goes. A traced program cannot branch on values
(``jax.lax.while_loop`` could loop, but not with a closure that updates the
modules' state in Python each time, nor with PyTorch's growing history
lists), so ``LBFGS.step`` runs eagerly only, and raises inside ``jm.compile``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._lowering import state as _state
from jmodule.nn.parameter import as_array
from jmodule.optim.optimizer import ParamsT, TorchOptimizer

__all__ = ["LBFGS"]

COMPILE_HELP = (
    "LBFGS.step() cannot run inside jm.compile: PyTorch's L-BFGS decides how many times to "
    "evaluate the closure, and at which step sizes, from the loss and gradient values it sees "
    "(its stopping tolerances and the strong-Wolfe line search), and a traced JAX program "
    "cannot branch on values. Call opt.step(closure) outside the compiled function (it then "
    "runs eagerly, the closure evaluated as often as PyTorch evaluates it)."
)
ARGUMENT_HELP = (
    " So an LBFGS optimizer cannot be an argument of a compiled function either; to zero its "
    "gradients inside one (a compiled closure), call model.zero_grad() there: the same .grad "
    "slots."
)


def _cubic_interpolate(
    x1: Any, f1: Any, g1: Any, x2: Any, f2: Any, g2: Any, bounds: Any = None
) -> Any:
    if bounds is not None:
        xmin_bound, xmax_bound = bounds
    else:
        xmin_bound, xmax_bound = (x1, x2) if x1 <= x2 else (x2, x1)
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    d2_square = d1**2 - g1 * g2
    if d2_square >= 0:
        d2 = jnp.sqrt(d2_square)
        if x1 <= x2:
            min_pos = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
        else:
            min_pos = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
        return min(max(min_pos, xmin_bound), xmax_bound)
    return (xmin_bound + xmax_bound) / 2.0


def _strong_wolfe(
    obj_func: Callable,
    x: list,
    t: Any,
    d: jax.Array,
    f: float,
    g: jax.Array,
    gtd: Any,
    c1: float = 1e-4,
    c2: float = 0.9,
    tolerance_change: float = 1e-9,
    max_ls: int = 25,
) -> tuple[float, jax.Array, Any, int]:
    """PyTorch's ``_strong_wolfe``, line for line (arrays are immutable: no clones)."""
    d_norm = jnp.max(jnp.abs(d))
    f_new, g_new = obj_func(x, t, d)
    ls_func_evals = 1
    gtd_new = jnp.dot(g_new, d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done = False
    ls_iter = 0
    while ls_iter < max_ls:
        if f_new > (f + c1 * t * gtd) or (ls_iter > 1 and f_new >= f_prev):
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            bracket, bracket_f, bracket_g = [t], [f_new], [g_new]
            done = True
            break
        if gtd_new >= 0:
            bracket, bracket_f = [t_prev, t], [f_prev, f_new]
            bracket_g, bracket_gtd = [g_prev, g_new], [gtd_prev, gtd_new]
            break
        min_step = t + 0.01 * (t - t_prev)
        max_step = t * 10
        tmp = t
        t = _cubic_interpolate(
            t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(min_step, max_step)
        )
        t_prev, f_prev, g_prev, gtd_prev = tmp, f_new, g_new, gtd_new
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = jnp.dot(g_new, d)
        ls_iter += 1
    if ls_iter == max_ls:
        bracket, bracket_f, bracket_g = [0, t], [f, f_new], [g, g_new]
    insuf_progress = False
    low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[-1] else (1, 0)
    while not done and ls_iter < max_ls:
        if abs(bracket[1] - bracket[0]) * d_norm < tolerance_change:
            break
        t = _cubic_interpolate(
            bracket[0], bracket_f[0], bracket_gtd[0], bracket[1], bracket_f[1], bracket_gtd[1]
        )
        eps = 0.1 * (max(bracket) - min(bracket))
        if min(max(bracket) - t, t - min(bracket)) < eps:
            if insuf_progress or t >= max(bracket) or t <= min(bracket):
                if abs(t - max(bracket)) < abs(t - min(bracket)):
                    t = max(bracket) - eps
                else:
                    t = min(bracket) + eps
                insuf_progress = False
            else:
                insuf_progress = True
        else:
            insuf_progress = False
        f_new, g_new = obj_func(x, t, d)
        ls_func_evals += 1
        gtd_new = jnp.dot(g_new, d)
        ls_iter += 1
        if f_new > (f + c1 * t * gtd) or f_new >= bracket_f[low_pos]:
            bracket[high_pos], bracket_f[high_pos] = t, f_new
            bracket_g[high_pos], bracket_gtd[high_pos] = g_new, gtd_new
            low_pos, high_pos = (0, 1) if bracket_f[0] <= bracket_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (bracket[high_pos] - bracket[low_pos]) >= 0:
                bracket[high_pos] = bracket[low_pos]
                bracket_f[high_pos] = bracket_f[low_pos]
                bracket_g[high_pos] = bracket_g[low_pos]
                bracket_gtd[high_pos] = bracket_gtd[low_pos]
            bracket[low_pos], bracket_f[low_pos] = t, f_new
            bracket_g[low_pos], bracket_gtd[low_pos] = g_new, gtd_new
    return bracket_f[low_pos], bracket_g[low_pos], bracket[low_pos], ls_func_evals


class LBFGS(TorchOptimizer):
    """L-BFGS (``torch.optim.LBFGS``): PyTorch's algorithm and state, eager only.

    ``step(closure)`` needs a closure (PyTorch style, calling
    ``opt.zero_grad()`` and ``jm.backward``, or one that only returns the
    loss) and evaluates it several times; it returns the loss of the first
    evaluation. One param group only. ``state_dict()`` has PyTorch's layout
    (``func_evals``, ``n_iter``, ``al``, ``d``, ``t``, ``old_dirs``,
    ``old_stps``, ``ro``, ``H_diag``, ``prev_flat_grad``, ``prev_loss``, all
    under the first parameter's index).

    Not inside ``jm.compile``: the iteration counts and the line search
    depend on the values computed (see the module docs); ``step`` raises a
    ``RuntimeError`` saying so. Complex parameters are not supported.

    Args:
        params: Parameters (or ``(name, Parameter)`` pairs); one group.
        lr: learning rate (the initial step length).
        max_iter: iterations per ``step``.
        max_eval: closure evaluations per ``step`` (default ``max_iter * 5 // 4``).
        tolerance_grad: stop when the largest gradient entry is this small.
        tolerance_change: stop when the step or the loss change is this small.
        history_size: curvature pairs kept.
        line_search_fn: None (a fixed step ``lr``) or ``"strong_wolfe"``.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> w = jm.nn.Parameter(jnp.array([3.0, -2.0]))
    >>> opt = jm.optim.LBFGS([w], line_search_fn="strong_wolfe")
    >>> loss = opt.step(lambda: ((w - 1.0) ** 2).sum())
    >>> [round(v, 4) for v in w.data.tolist()]
    [1.0, 1.0]
    """

    def __init__(
        self,
        params: ParamsT,
        lr: float = 1,
        max_iter: int = 20,
        max_eval: int | None = None,
        tolerance_grad: float = 1e-7,
        tolerance_change: float = 1e-9,
        history_size: int = 100,
        line_search_fn: str | None = None,
    ):
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        defaults = {
            "lr": lr,
            "max_iter": max_iter,
            "max_eval": max_eval,
            "tolerance_grad": tolerance_grad,
            "tolerance_change": tolerance_change,
            "history_size": history_size,
            "line_search_fn": line_search_fn,
        }
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise ValueError("LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]
        for p in self._params:
            if jnp.issubdtype(p.dtype, jnp.complexfloating):
                raise ValueError("jmodule's LBFGS does not support complex parameters")

    # ------------------------------------------------------------------ flat views

    def _gather_flat_grad(self) -> jax.Array:
        views = []
        for p in self._params:
            value = _state.peek(p)
            g = p.grad
            views.append(jnp.zeros(value.size, value.dtype) if g is None else jnp.ravel(g))
        return jnp.concatenate(views, 0)

    def _add_grad(self, step_size: Any, update: jax.Array) -> None:
        offset = 0
        for p in self._params:
            value = _state.peek(p)
            n = value.size
            piece = update[offset : offset + n].reshape(value.shape)
            _state.assign(p, (value + step_size * piece).astype(value.dtype))
            offset += n

    def _clone_param(self) -> list[jax.Array]:
        return [_state.peek(p) for p in self._params]

    def _set_param(self, params_data: list[jax.Array]) -> None:
        for p, value in zip(self._params, params_data):
            _state.assign(p, value)

    def _evaluate(self, closure: Callable[[], Any]) -> Any:
        return self._run_closure(closure)

    def _directional_evaluate(
        self, closure: Callable[[], Any], x: list, t: Any, d: jax.Array
    ) -> tuple[float, jax.Array]:
        self._add_grad(t, d)
        loss = float(self._evaluate(closure))
        flat_grad = self._gather_flat_grad()
        self._set_param(x)
        return loss, flat_grad

    # ------------------------------------------------------------------ step

    def step(self, closure: Callable[[], Any]) -> Any:  # type: ignore[override]
        """Run up to ``max_iter`` L-BFGS iterations; return the closure's first loss.

        Args:
            closure: re-evaluates the model and returns the loss (PyTorch
                style, or loss-only: see :meth:`Optimizer.step`).

        Raises:
            RuntimeError: inside ``jm.compile`` (see the class docs), or an
                unknown ``line_search_fn``.
        """
        if _state.tracing():
            raise RuntimeError(COMPILE_HELP)
        self._opt_called = True
        group = self.param_groups[0]
        lr = group["lr"]
        max_iter = group["max_iter"]
        max_eval = group["max_eval"]
        tolerance_grad = group["tolerance_grad"]
        tolerance_change = group["tolerance_change"]
        line_search_fn = group["line_search_fn"]
        history_size = group["history_size"]

        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)

        orig_loss = self._evaluate(closure)
        loss = float(orig_loss)
        current_evals = 1
        state["func_evals"] += 1

        flat_grad = self._gather_flat_grad()
        if jnp.max(jnp.abs(flat_grad)) <= tolerance_grad:
            return orig_loss

        d = state.get("d")
        t = state.get("t")
        old_dirs = state.get("old_dirs")
        old_stps = state.get("old_stps")
        ro = state.get("ro")
        H_diag = state.get("H_diag")
        prev_flat_grad = state.get("prev_flat_grad")
        prev_loss = state.get("prev_loss")

        n_iter = 0
        while n_iter < max_iter:
            n_iter += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d = -flat_grad
                old_dirs, old_stps, ro = [], [], []
                H_diag = 1
            else:
                y = flat_grad - prev_flat_grad
                s = d * t
                ys = jnp.dot(y, s)
                if ys > 1e-10:
                    if len(old_dirs) == history_size:
                        old_dirs.pop(0)
                        old_stps.pop(0)
                        ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    H_diag = ys / jnp.dot(y, y)
                num_old = len(old_dirs)
                if "al" not in state:
                    state["al"] = [None] * history_size
                al = state["al"]
                q = -flat_grad
                for i in range(num_old - 1, -1, -1):
                    al[i] = jnp.dot(old_stps[i], q) * ro[i]
                    q = q - al[i] * old_dirs[i]
                d = r = q * H_diag
                for i in range(num_old):
                    be_i = jnp.dot(old_dirs[i], r) * ro[i]
                    r = r + (al[i] - be_i) * old_stps[i]
                d = r

            prev_flat_grad = flat_grad
            prev_loss = loss
            if state["n_iter"] == 1:
                t = min(1.0, 1.0 / jnp.sum(jnp.abs(flat_grad))) * lr
            else:
                t = lr
            gtd = jnp.dot(flat_grad, d)
            if gtd > -tolerance_change:
                break

            ls_func_evals = 0
            if line_search_fn is not None:
                if line_search_fn != "strong_wolfe":
                    raise RuntimeError("only 'strong_wolfe' is supported")
                x_init = self._clone_param()

                def obj_func(x: list, t: Any, d: jax.Array) -> tuple[float, jax.Array]:
                    return self._directional_evaluate(closure, x, t, d)

                loss, flat_grad, t, ls_func_evals = _strong_wolfe(
                    obj_func, x_init, t, d, loss, flat_grad, gtd, max_ls=max_eval - current_evals
                )
                self._add_grad(t, d)
                opt_cond = jnp.max(jnp.abs(flat_grad)) <= tolerance_grad
            else:
                self._add_grad(t, d)
                opt_cond = False
                if n_iter != max_iter:
                    loss = float(self._evaluate(closure))
                    flat_grad = self._gather_flat_grad()
                    opt_cond = jnp.max(jnp.abs(flat_grad)) <= tolerance_grad
                    ls_func_evals = 1
            current_evals += ls_func_evals
            state["func_evals"] += ls_func_evals

            if n_iter == max_iter:
                break
            if current_evals >= max_eval:
                break
            if opt_cond:
                break
            if jnp.max(jnp.abs(d * t)) <= tolerance_change:
                break
            if abs(loss - prev_loss) < tolerance_change:
                break

        state["d"] = d
        state["t"] = t
        state["old_dirs"] = old_dirs
        state["old_stps"] = old_stps
        state["ro"] = ro
        state["H_diag"] = H_diag
        state["prev_flat_grad"] = prev_flat_grad
        state["prev_loss"] = prev_loss
        return orig_loss

    # ------------------------------------------------------------------ the rest of the interface

    def _jm_describe(self) -> Any:
        raise RuntimeError(COMPILE_HELP + ARGUMENT_HELP)

    def _structure(self, group: dict[str, Any]) -> tuple:
        return ()

    def _packed_state(self, index: dict[int, int]) -> dict[str, Any]:
        out = {}
        for p, entry in self.state.items():
            out[index[id(p)]] = {k: list(v) if isinstance(v, list) else v for k, v in entry.items()}
        return {"state": out}

    def _check_state(
        self, state_dict: dict[str, Any], groups: list[dict[str, Any]], id_map: dict
    ) -> Callable[[], None]:
        problems, loaded = [], {}
        for k, saved in state_dict["state"].items():
            p = id_map.get(k)
            if p is None:
                problems.append(f"state for parameter {k!r}, which no param group lists")
                continue
            loaded[p] = {k2: _loaded(v) for k2, v in saved.items()}
        if problems:
            raise ValueError("Error(s) in loading state_dict:\n\t" + "\n\t".join(problems))

        def apply() -> None:
            self.state.clear()
            self.state.update(loaded)
            self._params = groups[0]["params"]

        return apply


def _loaded(value: Any) -> Any:
    """A state entry from a state dict (torch's tensors or ours) as jmodule keeps it."""
    if isinstance(value, list):
        return [_loaded(v) for v in value]
    if value is None or isinstance(value, (int, float)):
        return value
    return as_array(value)
