"""``jm.summary``: a per-layer table of a model, like torchinfo or ``nnx.tabulate``.

Output shapes come from one abstract run (``jax.eval_shape``: nothing is
computed, no buffer changes); FLOPs and memory come from XLA's cost and
memory analysis of the compiled forward.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from jmodule import func

__all__ = ["LayerRow", "Summary", "summary"]


@dataclass(frozen=True)
class LayerRow:
    """One module of the tree."""

    path: str
    kind: str
    depth: int
    output_shapes: tuple[tuple[int, ...], ...]
    params: int
    trainable: int
    bytes: int
    dtypes: tuple[str, ...]


@dataclass
class Summary:
    """The table ``jm.summary`` prints; ``str()`` is the text, Jupyter shows HTML."""

    model_name: str
    rows: list[LayerRow]
    total_params: int
    trainable_params: int
    param_bytes: int
    buffer_bytes: int
    flops: float | None = None
    memory: dict[str, int] = field(default_factory=dict)

    def _lines(self) -> list[list[str]]:
        out = []
        for r in self.rows:
            shapes = ", ".join(str(list(s)) for s in r.output_shapes) or "-"
            out.append(
                [
                    "  " * r.depth + (f"{r.path} ({r.kind})" if r.path else r.kind),
                    shapes,
                    f"{r.params:,}",
                    f"{r.bytes:,}",
                    ",".join(r.dtypes) or "-",
                ]
            )
        return out

    def __str__(self) -> str:
        header = ["Layer (type)", "Output shape", "Param #", "Bytes", "Dtype"]
        lines = self._lines()
        widths = [max(len(h), *(len(row[i]) for row in lines)) for i, h in enumerate(header)]
        rule = "=" * (sum(widths) + 2 * (len(widths) - 1))

        def fmt(row: list[str]) -> str:
            return "  ".join(
                c.ljust(w) if i in (0, 1, 4) else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths))
            )

        text = [rule, fmt(header), rule, *(fmt(r) for r in lines), rule]
        text.append(f"Total params: {self.total_params:,}")
        text.append(f"Trainable params: {self.trainable_params:,}")
        text.append(f"Non-trainable params: {self.total_params - self.trainable_params:,}")
        text.append(
            f"Params size: {self.param_bytes:,} bytes; buffers: {self.buffer_bytes:,} bytes"
        )
        if self.flops is not None:
            text.append(f"Compiled forward: {self.flops:,.0f} FLOPs (XLA cost analysis)")
        if self.memory:
            parts = ", ".join(f"{k} {v:,} B" for k, v in self.memory.items())
            text.append(f"Compiled forward memory: {parts}")
        text.append(rule)
        return "\n".join(text)

    def _repr_html_(self) -> str:
        head = "".join(
            f"<th>{h}</th>" for h in ["Layer (type)", "Output shape", "Param #", "Bytes", "Dtype"]
        )
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in self._lines()
        )
        foot = html.escape(str(self).split("\n", 3)[-1]) if self.rows else ""
        return f"<table><tr>{head}</tr>{body}</table><pre>{foot}</pre>"


def _nbytes(x: Any) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def summary(model: Any, *example_inputs: Any, compiled: bool = True, **kwargs: Any) -> Summary:
    """Print and return a per-layer table of ``model`` run on ``example_inputs``.

    Args:
        model: the module.
        *example_inputs: positional inputs (arrays or ``jax.ShapeDtypeStruct``).
        compiled: also report the compiled forward's FLOPs and memory.
        **kwargs: keyword inputs of the forward.

    Returns:
        The :class:`Summary` (its ``str`` is what was printed).

    >>> import jax.numpy as jnp
    >>> import jmodule as jm
    >>> model = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.ReLU(), jm.nn.Linear(8, 2))
    >>> s = jm.summary(model, jnp.ones((3, 4)), compiled=False)  # doctest: +ELLIPSIS
    ===...
    >>> s.total_params, s.rows[-1].output_shapes
    (58, ((3, 2),))
    """
    shapes: dict[int, tuple] = {}
    handles = []
    named = list(model.named_modules())
    for _, m in named:

        def hook(mod: Any, args: Any, out: Any) -> None:
            leaves = jax.tree_util.tree_leaves(out)
            shapes[id(mod)] = tuple(tuple(x.shape) for x in leaves if hasattr(x, "shape"))

        handles.append(m.register_forward_hook(hook))
    state = {k: v for k, v in func.state_slots(model).items()}
    values = {k: c[n] for k, (c, n) in state.items()}
    try:
        jax.eval_shape(
            lambda s, a, k: func.functional_call(model, s, a, k, rng_key=jax.random.PRNGKey(0)),
            values,
            example_inputs,
            kwargs,
        )
    finally:
        for h in handles:
            h.remove()
    rows = []
    for path, m in named:
        own = list(m.parameters())
        dtypes = sorted({str(p.dtype) for p in own})
        rows.append(
            LayerRow(
                path=path,
                kind=type(m).__name__,
                depth=path.count(".") + (1 if path else 0),
                output_shapes=shapes.get(id(m), ()),
                params=sum(int(np.prod(p.shape)) for p in own),
                trainable=sum(int(np.prod(p.shape)) for p in own if p.requires_grad),
                bytes=sum(_nbytes(p) for p in own),
                dtypes=tuple(dtypes),
            )
        )
    params = list(model.parameters())
    result = Summary(
        model_name=type(model).__name__,
        rows=rows,
        total_params=sum(int(np.prod(p.shape)) for p in params),
        trainable_params=sum(int(np.prod(p.shape)) for p in params if p.requires_grad),
        param_bytes=sum(_nbytes(p) for p in params),
        buffer_bytes=sum(_nbytes(b) for b in model.buffers()),
    )
    if compiled:
        lowered = jax.jit(
            lambda s, a, k: func.functional_call(model, s, a, k, rng_key=jax.random.PRNGKey(0))
        ).lower(values, example_inputs, kwargs)
        exe = lowered.compile()
        cost = exe.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        result.flops = float(cost.get("flops", 0.0)) if cost else None
        mem = exe.memory_analysis()
        if mem is not None:
            result.memory = {
                "arguments": int(mem.argument_size_in_bytes),
                "outputs": int(mem.output_size_in_bytes),
                "temporaries": int(mem.temp_size_in_bytes),
            }
    print(result)
    return result
