"""Activation checkpointing, as ``torch.utils.checkpoint``, on ``jax.checkpoint``.

``checkpoint(fn, *args)`` computes ``fn(*args)`` and keeps none of its
intermediate activations for the backward pass: they are recomputed there
(``jax.checkpoint``, also called remat), trading compute for memory. Values
and gradients are those of ``fn(*args)`` itself.

Only PyTorch's non-reentrant variant exists: JAX has no autograd tape to
re-enter, and ``jax.checkpoint`` is what the non-reentrant variant describes
(recompute the saved tensors of a region when the backward pass needs them).
``use_reentrant=True`` raises; not passing it warns, as PyTorch does, and
means ``False`` (where PyTorch would still choose the reentrant variant).

What ``fn`` does to jmodule state behaves as without checkpointing:

* parameters it reads are differentiated by ``jm.backward`` (their ``.grad``)
  eagerly and inside ``jm.compile``, as any other read;
* buffer writes (BatchNorm running statistics in training mode) to modules
  that ``fn`` *is* or holds (a Module, a bound method of one, a
  ``functools.partial`` or a closure over modules, modules among the
  arguments) are threaded through the checkpointed region and persist;
* random draws (dropout) from the default generator continue its stream as
  without checkpointing, and the recomputation in the backward pass sees the
  same draws as the forward pass (the key is an input of the region).

A buffer of a module ``fn`` reaches only in another way (a global, an
attribute of an unrelated object) is not threaded: writing it inside the
region raises. Pass that module, or a function holding it, instead.

Where the recomputation runs, per backend:

* GPU and TPU: ``jax.checkpoint`` as it is. Its optimization barriers keep
  each recomputation in the backward pass until XLA has scheduled it.
* CPU: XLA:CPU expands those barriers before it schedules
  (OptimizationBarrierExpander), after which nothing stops the
  recomputation from being merged with the forward pass or run early, so a
  plain ``jax.checkpoint`` costs the recomputation and saves no memory there
  (``benchmarks/remat.py``). So on CPU the region runs through a
  ``jax.custom_vjp``: its forward rule is ``jax.vjp`` of ``jax.checkpoint``
  of the region (only the inputs, or what ``policy`` saves, are kept), and
  its backward rule first makes every kept value depend on the cotangent
  arriving at the region (``where(c, x, 0)`` with ``c`` a comparison that is
  always true, computed from the sum of the cotangent, which XLA cannot
  fold), then runs the saved pullback. The recomputation cannot start before
  the backward pass reaches the region, on any scheduler. Values are the
  same (``where`` of a true condition is exact); the recomputation costs
  about one more forward pass, as on GPU.

  Forward-mode differentiation (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``,
  ``jax.linearize``) has no ``custom_vjp`` rule: under it the region uses
  ``jax.checkpoint``, which forward mode differentiates as ``fn`` itself
  (forward mode keeps no activations for a backward pass, so nothing is
  lost). Second derivatives (``jax.grad`` of ``jax.grad``) go through the
  ``custom_vjp``, whose backward rule is differentiable. With
  ``jax_use_direct_linearize`` off, ``jax.vjp`` itself is forward mode
  followed by transposition, and the region uses ``jax.checkpoint``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend import core as jex_core
from jax.extend.core import jaxpr_as_fun
from jax.interpreters import partial_eval as _pe

from jmodule import _jax_internals as _jx
from jmodule import random as _random
from jmodule._lowering import binding, state
from jmodule.nn.modules.module import Module

__all__ = ["checkpoint", "checkpoint_sequential"]

_REENTRANT = (
    "use_reentrant=True is not supported: jmodule has only PyTorch's non-reentrant "
    "checkpointing. JAX keeps no autograd tape, so there is nothing to re-enter; the "
    "checkpointed region is recomputed by jax.checkpoint, which is what the non-reentrant "
    "variant does. Pass use_reentrant=False."
)

_NOT_PASSED = (
    "{who}: the use_reentrant parameter should be passed explicitly, as PyTorch asks. "
    "PyTorch would use the reentrant variant here; jmodule has only the non-reentrant "
    "one and uses use_reentrant=False. Pass use_reentrant=False to silence this warning."
)

_NO_PRESERVE = (
    "checkpoint(preserve_rng_state=False) is not supported: under jax.checkpoint the "
    "recomputation in the backward pass replays the random key of the forward pass, so its "
    "draws (dropout masks) are always those of the forward pass, as with the default "
    "preserve_rng_state=True."
)

_UNTHREADED_BUFFER = (
    "checkpoint: a buffer was written inside the checkpointed region, but it belongs to a "
    "module the region's function does not hold, so its new value cannot leave the "
    "region. Checkpoint the module itself (checkpoint(block, x)), a bound method of it, or "
    "a function that holds it (a closure or functools.partial), or pass it as an argument."
)


def _resolve_reentrant(use_reentrant: bool | None, who: str) -> None:
    if use_reentrant is None:
        warnings.warn(_NOT_PASSED.format(who=who), UserWarning, stacklevel=3)
    elif use_reentrant:
        raise ValueError(_REENTRANT)


def _resolve_policy(policy: Callable[..., bool] | str | None) -> Callable[..., bool] | None:
    """A JAX checkpoint policy: the policy, or its name in ``jax.checkpoint_policies``."""
    if policy is None or callable(policy):
        return policy
    if isinstance(policy, str):
        found = getattr(jax.checkpoint_policies, policy, None)
        if callable(found) and not policy.startswith("_"):
            return found
        names = sorted(
            n
            for n in dir(jax.checkpoint_policies)
            if not n.startswith("_") and callable(getattr(jax.checkpoint_policies, n))
        )
        raise ValueError(
            f"checkpoint: unknown policy {policy!r}; jax.checkpoint_policies has "
            f"{', '.join(names)} (those that take arguments, such as save_only_these_names, "
            "are given called: policy=jax.checkpoint_policies.save_only_these_names('x'))"
        )
    raise TypeError(
        f"checkpoint: policy must be a jax.checkpoint_policies policy or its name, "
        f"not {type(policy).__name__}"
    )


def _held_modules(obj: Any, out: dict[int, Module], depth: int = 0) -> None:
    """The modules ``obj`` is or holds (bound method, partial, closure, containers)."""
    if depth > 3:
        return
    if isinstance(obj, Module):
        out.setdefault(id(obj), obj)
        return
    if isinstance(obj, (list, tuple)):
        for x in obj:
            _held_modules(x, out, depth + 1)
        return
    if isinstance(obj, dict):
        for x in obj.values():
            _held_modules(x, out, depth + 1)
        return
    if isinstance(obj, functools.partial):
        _held_modules(obj.func, out, depth + 1)
        _held_modules(obj.args, out, depth + 1)
        _held_modules(obj.keywords, out, depth + 1)
        return
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, Module):
        out.setdefault(id(owner), owner)
    for cell in getattr(obj, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        _held_modules(held, out, depth + 1)


def _buffer_slots(modules: Iterable[Module]) -> tuple[list[state.Slot], list[Module]]:
    """Every buffer slot of the module trees (each once) and the module owning it."""
    slots: list[state.Slot] = []
    owners: list[Module] = []
    seen: set[int] = set()
    for root in modules:
        for _, m in root.named_modules():
            buffers = m.__dict__["_buffers"]
            if id(buffers) in seen:
                continue
            seen.add(id(buffers))
            for name, b in buffers.items():
                if b is not None:
                    slots.append((buffers, name))
                    owners.append(m)
    return slots, owners


def _recompute_after_cotangent() -> bool:
    """Whether this region recomputes behind a dependency on its cotangent (see the module).

    On XLA:CPU only (elsewhere ``jax.checkpoint``'s barriers already keep the
    recomputation in the backward pass), and not under forward-mode
    differentiation (``jax.jvp``, ``jax.jacfwd``, ``jax.hessian``,
    ``jax.linearize``): a ``jax.custom_vjp`` has no forward mode, and forward
    mode keeps no activations for a backward pass anyway. ``jax.vjp`` and
    ``jax.grad`` (``jm.backward``) trace with a ``LinearizeTrace`` marked
    ``is_vjp``; ``jax.linearize`` with one that is not.
    """
    if jax.default_backend() != "cpu":
        return False
    trace = _jx.current_trace()
    while trace is not None:
        if _jx.forward_mode(trace):
            return False  # forward mode: jax.jvp, jax.jacfwd, jax.linearize
        trace = _jx.parent_trace(trace)
    return True


def _keep_until(ready: jax.Array, x: Any) -> Any:
    """``x`` itself, computed from ``ready`` (always True) so nothing can run before ``ready``."""
    if not isinstance(x, jax.Array) or x.dtype == jax.dtypes.float0:
        return x
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        data = jax.random.key_data(x)
        return jax.random.wrap_key_data(
            jnp.where(ready, data, jnp.zeros_like(data)), impl=jax.random.key_impl(x)
        )
    return jnp.where(ready, x, jnp.zeros_like(x))


def _arrived(cotangents: Any) -> jax.Array | None:
    """A boolean that is True, computed from a cotangent (None: no floating one)."""
    for g in jax.tree_util.tree_leaves(cotangents):
        if isinstance(g, jax.Array) and g.size and jnp.issubdtype(g.dtype, jnp.inexact):
            # a reduction, not one element: XLA duplicates an element's producers into
            # every consumer fusion, a reduction it computes once
            s = jnp.sum(g)
            # 0 for every value of s (inf and NaN too); XLA cannot fold it, s is computed
            return jnp.where(jnp.isfinite(s), s, 0) * 0 == 0
    return None


def _after_cotangent(
    region: Callable[..., Any], policy: Callable[..., bool] | None, args: tuple
) -> Any:
    """``region(*args)``, differentiated with its recomputation waiting for its cotangent.

    The region is traced once (``jax.make_jaxpr``: its Python runs here, once).
    Its floating outputs come from a ``jax.custom_vjp`` whose forward rule is
    ``jax.vjp`` of ``jax.checkpoint`` of the traced program (so only the
    inputs, or what ``policy`` saves, are kept) and whose backward rule first
    makes every kept value depend on the incoming cotangent, then runs the
    saved pullback. Its other outputs (the generator's key, integer buffers),
    which have no cotangent, come from the program without them, outside the
    ``custom_vjp``, so they stay concrete where they would without it. The
    values the tracing closed over are explicit inputs: a ``custom_vjp``
    function may not close over what is differentiated.
    """
    flat, in_tree = jax.tree_util.tree_flatten(args)
    closed, shapes = jax.make_jaxpr(
        lambda *a: region(*jax.tree_util.tree_unflatten(in_tree, a)), return_shape=True
    )(*flat)
    out_tree = jax.tree_util.tree_structure(shapes)
    program = _jx.convert_constvars_jaxpr(closed.jaxpr)  # consts first, then ``flat``
    inputs = [*closed.consts, *flat]
    real = [jnp.issubdtype(a.dtype, jnp.inexact) for a in closed.out_avals]
    out: list[Any] = [None] * len(real)

    def run(jaxpr: Any, inputs: list) -> list:
        return jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, ()))(*inputs)

    if not all(real):
        others, _ = _pe.dce_jaxpr(program, [not r for r in real], instantiate=True)
        for i, v in zip([i for i, r in enumerate(real) if not r], run(others, inputs)):
            out[i] = v
    if any(real):
        floating, _ = _pe.dce_jaxpr(program, real, instantiate=True)
        if closed.effects:  # a custom_vjp cannot carry effects: as jax.checkpoint does
            values = jax.checkpoint(functools.partial(run, floating), policy=policy)(inputs)
        else:
            values = _recompute_call(floating, policy, inputs)
        for i, v in zip([i for i, r in enumerate(real) if r], values):
            out[i] = v
    return jax.tree_util.tree_unflatten(out_tree, out)


def _recompute_call(jaxpr: Any, policy: Callable[..., bool] | None, inputs: list) -> list:
    """``jaxpr(*inputs)`` under a ``custom_vjp`` that recomputes it after its cotangent."""

    def run(inputs: list) -> list:
        return jaxpr_as_fun(jex_core.ClosedJaxpr(jaxpr, ()))(*inputs)

    @jax.custom_vjp
    def call(inputs: list) -> list:
        return run(inputs)

    def forward(inputs: list) -> tuple:
        return jax.vjp(jax.checkpoint(run, policy=policy), inputs)

    def backward(pullback: Any, cotangents: list) -> tuple:
        ready = _arrived(cotangents)
        if ready is not None:
            pullback = jax.tree_util.tree_map(functools.partial(_keep_until, ready), pullback)
        return pullback(cotangents)

    call.defvjp(forward, backward)
    return call(inputs)


def _is_dynamic(x: Any) -> bool:
    """Whether an argument leaf is an array the checkpointed region takes as an input."""
    return isinstance(x, (jax.Array, np.ndarray, state.Cell))


def _run(
    fn: Callable[..., Any],
    args: tuple,
    kwargs: dict[str, Any],
    policy: Callable[..., bool] | None,
    modules: Iterable[Module],
) -> Any:
    """``fn(*args, **kwargs)`` under ``jax.checkpoint``, with buffers and the RNG key threaded."""
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs), is_leaf=state.is_cell)
    where = [i for i, x in enumerate(leaves) if _is_dynamic(x)]
    dynamic = [state.value(leaves[i]) for i in where]
    slots, owners = _buffer_slots(modules)
    buffer_values = [state.value(c[k]) for c, k in slots]
    gen = _random.default_generator
    key_slot = state.rng_slot(gen)
    key = key_slot[0][key_slot[1]]
    box: dict[str, Any] = {}

    def region(dynamic: list, buffer_values: list, key: Any) -> tuple:
        filled = list(leaves)
        for i, v in zip(where, dynamic):
            filled[i] = v
        a, kw = jax.tree_util.tree_unflatten(treedef, filled)
        # Inside the region only its own slots count as bound: a buffer write to any
        # other module (one an enclosing compiled program bound) would leave a value
        # of this region's trace behind, so it raises instead (``Module._set_buffer``).
        outer = state.local.bound
        state.local.bound = []
        try:
            with binding.bound([*slots, key_slot], [*buffer_values, key]):
                try:
                    out = fn(*a, **kw)
                except binding.TracerLeakError as e:
                    raise binding.TracerLeakError(_UNTHREADED_BUFFER) from e
                new_buffers = [state.value(c[k]) for c, k in slots]
                new_key = key_slot[0][key_slot[1]]
        finally:
            state.local.bound = outer
        changed = [i for i, (n, o) in enumerate(zip(new_buffers, buffer_values)) if n is not o]
        out_leaves, out_tree = jax.tree_util.tree_flatten(out, is_leaf=state.is_cell)
        out_leaves = [state.value(x) for x in out_leaves]
        arrays = [i for i, x in enumerate(out_leaves) if isinstance(x, jax.Array)]
        box.update(
            changed=changed,
            out_tree=out_tree,
            out_leaves=out_leaves,
            arrays=arrays,
            drew=new_key is not key,
        )
        return [out_leaves[i] for i in arrays], [new_buffers[i] for i in changed], new_key

    if _recompute_after_cotangent():
        outs, new_buffers, new_key = _after_cotangent(region, policy, (dynamic, buffer_values, key))
    else:
        outs, new_buffers, new_key = jax.checkpoint(region, policy=policy)(
            dynamic, buffer_values, key
        )
    for i, v in zip(box["changed"], new_buffers):
        container, name = slots[i]
        owners[i]._set_buffer(container, name, v)
    if box["drew"]:
        if (
            isinstance(new_key, jax.core.Tracer)
            and not isinstance(key, jax.core.Tracer)
            and not state.is_bound(gen.__dict__)
        ):
            raise RuntimeError(_random._FOREIGN_TRACE)
        key_slot[0][key_slot[1]] = new_key
    out_leaves = list(box["out_leaves"])
    for i, v in zip(box["arrays"], outs):
        out_leaves[i] = v
    return jax.tree_util.tree_unflatten(box["out_tree"], out_leaves)


def checkpoint(
    function: Callable[..., Any],
    *args: Any,
    use_reentrant: bool | None = None,
    policy: Callable[..., bool] | str | None = None,
    preserve_rng_state: bool = True,
    context_fn: Callable[[], Any] | None = None,
    determinism_check: str = "default",
    debug: bool = False,
    early_stop: bool = True,
    **kwargs: Any,
) -> Any:
    """``function(*args, **kwargs)``, recomputed in the backward pass instead of stored.

    As ``torch.utils.checkpoint.checkpoint`` with ``use_reentrant=False``,
    on ``jax.checkpoint``: the same values and gradients as calling
    ``function`` directly, with only the region's inputs kept for the
    backward pass (or what ``policy`` saves). Memory falls in a compiled
    training step on every backend; on CPU the recomputation is made to
    wait for the region's cotangent, as the module docstring describes
    (``benchmarks/remat.py`` measures it).

    Args:
        function: what to run: a module, a bound method, or any function of
            arrays (keyword arguments are passed on to it).
        *args: its positional arguments.
        use_reentrant: ``False`` (the only variant); ``None`` warns, as
            PyTorch does, and means ``False``; ``True`` raises.
        policy: which intermediate values to save rather than recompute: a
            policy of ``jax.checkpoint_policies`` (such as
            ``jax.checkpoint_policies.dots_saveable``, matmul outputs), or its
            name (``"dots_saveable"``). ``None`` saves nothing.
        preserve_rng_state: ``True`` (the recomputation always sees the
            forward pass's random draws); ``False`` raises.
        context_fn: not supported (``None`` only): PyTorch's hooks into its
            saved-tensor machinery have no JAX counterpart.
        determinism_check: ``"default"`` or ``"none"``: recomputation replays
            the same program, so it is deterministic either way.
        debug: ``False`` only.
        early_stop: accepted; XLA schedules the recomputation.
        **kwargs: keyword arguments of ``function``.

    Returns:
        What ``function`` returns.

    Raises:
        ValueError: ``use_reentrant=True``, ``preserve_rng_state=False``,
            ``context_fn``, ``debug=True``, an unknown ``determinism_check``
            or an unknown policy name.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.utils.checkpoint import checkpoint
    >>> block = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.GELU(), jm.nn.Linear(8, 4))
    >>> x = jnp.ones((2, 4))
    >>> checkpoint(block, x, use_reentrant=False).shape
    (2, 4)
    >>> loss = jm.backward(lambda: checkpoint(block, x, use_reentrant=False).sum())
    >>> block[0].weight.grad.shape
    (8, 4)
    """
    _resolve_reentrant(use_reentrant, "jm.utils.checkpoint.checkpoint")
    if not preserve_rng_state:
        raise ValueError(_NO_PRESERVE)
    if context_fn is not None:
        raise ValueError(
            "checkpoint(context_fn=...) is not supported: it hooks PyTorch's saved-tensor "
            "machinery, which JAX does not have. Use policy= to choose what is saved."
        )
    if debug:
        raise ValueError("checkpoint(debug=True) is not supported: jax.checkpoint has no trace log")
    if determinism_check not in ("default", "none"):
        raise ValueError(
            f"determinism_check should be 'default' or 'none', but got {determinism_check!r}"
        )
    del early_stop
    held: dict[int, Module] = {}
    _held_modules(function, held)
    _held_modules(args, held)
    _held_modules(kwargs, held)
    return _run(function, args, kwargs, _resolve_policy(policy), held.values())


def checkpoint_sequential(
    functions: Any,
    segments: int,
    input: Any,  # PyTorch's name
    use_reentrant: bool | None = None,
    *,
    policy: Callable[..., bool] | str | None = None,
    preserve_rng_state: bool = True,
) -> Any:
    """Run a sequence of modules in ``segments`` chunks, checkpointing all but the last.

    As ``torch.utils.checkpoint.checkpoint_sequential``: ``functions`` (a
    ``Sequential`` or a list of modules/functions) is split into
    ``segments`` chunks of ``len(functions) // segments``; every chunk but
    the last runs under :func:`checkpoint`, the last one (with any
    remainder) runs normally, as PyTorch does.

    Args:
        functions: a ``Sequential``, or a list of modules or functions.
        segments: the number of chunks.
        input: the input of the first function.
        use_reentrant: as in :func:`checkpoint`.
        policy: as in :func:`checkpoint`.
        preserve_rng_state: as in :func:`checkpoint`.

    Returns:
        The output of the last function.

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> from jmodule.utils.checkpoint import checkpoint_sequential
    >>> model = jm.nn.Sequential(*[jm.nn.Linear(4, 4) for _ in range(4)])
    >>> checkpoint_sequential(model, 2, jnp.ones((3, 4)), use_reentrant=False).shape
    (3, 4)
    """
    _resolve_reentrant(use_reentrant, "jm.utils.checkpoint.checkpoint_sequential")
    if not preserve_rng_state:
        raise ValueError(_NO_PRESERVE)
    resolved = _resolve_policy(policy)
    if isinstance(functions, Module):
        functions = list(functions.children())
    functions = list(functions)
    size = len(functions) // segments

    def chunk(start: int, end: int) -> Callable[[Any], Any]:
        def run(x: Any) -> Any:
            for f in functions[start : end + 1]:
                x = f(x)
            return x

        return run

    end = -1
    for start in range(0, size * (segments - 1), size):
        end = start + size - 1
        held: dict[int, Module] = {}
        _held_modules(functions[start : end + 1], held)
        input = _run(chunk(start, end), (input,), {}, resolved, held.values())
    return chunk(end + 1, len(functions) - 1)(input)
