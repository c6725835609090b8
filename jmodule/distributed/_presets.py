"""Rule presets: fully sharded data parallel and Megatron-style tensor parallel.

Each preset returns a rule list for :func:`jmodule.distributed.shard`;
concatenate lists to combine them (first match wins), e.g.
``tensor_parallel(mesh) + fsdp(mesh)`` shards attention and MLP weights
over ``"model"`` and everything else over ``"data"``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from jax.sharding import Mesh, PartitionSpec

from jmodule._placement.sharding import Spec, axis_size

__all__ = ["DEFAULT_TP_PLAN", "fsdp", "tensor_parallel"]

Style = Literal["colwise", "rowwise"]


class _Fsdp:
    """The FSDP rule: shard the largest dimension the axis divides; replicate otherwise."""

    def __init__(self, axis: str | tuple[str, ...], size: int, min_size: int):
        self.axis = axis
        self.size = size
        self.min_size = min_size
        self.__name__ = f"fsdp(axis={axis!r})"

    def __call__(self, name: str, shape: tuple[int, ...]) -> PartitionSpec:
        count = 1
        for n in shape:
            count *= n
        if count < self.min_size:
            return PartitionSpec()
        best = None
        for dim, n in enumerate(shape):
            if n % self.size == 0 and n > 0 and (best is None or n > shape[best]):
                best = dim
        if best is None:
            return PartitionSpec()
        return PartitionSpec(*([None] * best), self.axis)


def fsdp(
    mesh: Mesh, axis: str | tuple[str, ...] = "data", *, min_size: int = 0
) -> list[tuple[str, Spec]]:
    """Fully sharded data parallel: every parameter and buffer split over ``axis``.

    Each array is split along its largest dimension that the number of
    devices on ``axis`` divides (arrays with none, and arrays with fewer
    than ``min_size`` elements, stay replicated). With the batch sharded
    over the same axis, XLA gathers each weight where it is used and
    reduce-scatters its gradient: ZeRO-3 / PyTorch FSDP, written as
    shardings.

    Args:
        mesh: the device mesh (the axis size decides which dimension splits).
        axis: the data axis name (or a tuple of names).
        min_size: arrays smaller than this stay replicated.

    Returns:
        ``[("*", rule)]``, for :func:`jmodule.distributed.shard`.

    Raises:
        ValueError: ``axis`` is not a mesh axis.

    >>> import jmodule as jm
    >>> mesh = jm.distributed.make_mesh({"data": 8})
    >>> model = jm.distributed.shard(jm.nn.Linear(4, 16), mesh, jm.distributed.fsdp(mesh))
    >>> model.weight.sharding.spec, model.weight.addressable_shards[0].data.shape
    (P('data',), (2, 4))
    """
    return [("*", _Fsdp(axis, axis_size(mesh, axis), min_size))]


#: Module-name patterns of PyTorch's layers and common model code, and how
#: tensor parallelism splits them (Megatron-LM's column/row pairs).
DEFAULT_TP_PLAN: dict[str, Style] = {
    # nn.TransformerEncoderLayer / TransformerDecoderLayer feed-forward
    "*.linear1": "colwise",
    "*.linear2": "rowwise",
    # nn.MultiheadAttention output projection (its input projections are below)
    "*.out_proj": "rowwise",
    # common MLP and attention names (GPT/BERT/Llama-style model code)
    "*.fc1": "colwise",
    "*.fc2": "rowwise",
    "*.q_proj": "colwise",
    "*.k_proj": "colwise",
    "*.v_proj": "colwise",
    "*.o_proj": "rowwise",
    "*.gate_proj": "colwise",
    "*.up_proj": "colwise",
    "*.down_proj": "rowwise",
}


def _linear_rules(pattern: str, style: Style, axis: str | tuple[str, ...]) -> list:
    if style == "colwise":
        return [
            (f"{pattern}.weight", PartitionSpec(axis, None)),
            (f"{pattern}.bias", PartitionSpec(axis)),
        ]
    if style == "rowwise":
        return [
            (f"{pattern}.weight", PartitionSpec(None, axis)),
            (f"{pattern}.bias", PartitionSpec()),
        ]
    raise ValueError(
        f"tensor_parallel plan entry {pattern!r}: style must be 'colwise' or 'rowwise', "
        f"got {style!r}"
    )


def tensor_parallel(
    mesh: Mesh,
    axis: str | tuple[str, ...] = "model",
    plan: Mapping[str, Style] | None = None,
    *,
    defaults: bool = True,
) -> list[tuple[str, Spec]]:
    """Megatron-style tensor parallelism for Linear and attention layers.

    A *column-parallel* Linear splits its output features over ``axis``
    (``weight (out, in)`` as ``P(axis, None)``, ``bias`` as ``P(axis)``); the
    *row-parallel* Linear after it splits its input features
    (``P(None, axis)``, bias replicated), so the pair needs one reduction
    of activations, which XLA inserts. ``nn.MultiheadAttention``'s
    ``in_proj_weight``/``in_proj_bias`` and ``q/k/v_proj_weight`` are
    column-parallel and ``out_proj`` row-parallel. The packed
    ``in_proj_weight (3E, E)`` is split by rows, which aligns with heads
    only when each shard holds whole heads of q, k and v; results are
    exact either way (XLA moves what it needs).

    Args:
        mesh: the device mesh.
        axis: the model-parallel axis name.
        plan: ``{module_pattern: "colwise" | "rowwise"}`` for Linear-like
            modules (patterns over module names, e.g. ``"*.mlp.up"``); they
            come before the built-in :data:`DEFAULT_TP_PLAN`.
        defaults: include :data:`DEFAULT_TP_PLAN` and the attention rules.

    Returns:
        A rule list for :func:`jmodule.distributed.shard`. Parameters it
        does not name stay unmatched (replicated unless a later rule, such as
        :func:`fsdp`, takes them).

    Raises:
        ValueError: ``axis`` is not a mesh axis, or a plan style is unknown.

    >>> import jmodule as jm
    >>> mesh = jm.distributed.make_mesh({"data": 2, "model": 4})
    >>> mlp = jm.nn.Sequential()
    >>> mlp.fc1, mlp.fc2 = jm.nn.Linear(4, 8), jm.nn.Linear(8, 4)
    >>> _ = jm.distributed.shard(mlp, mesh, jm.distributed.tensor_parallel(mesh))
    >>> mlp.fc1.weight.sharding.spec, mlp.fc2.weight.sharding.spec
    (P('model', None), P(None, 'model'))
    >>> mlp.fc1.weight.addressable_shards[0].data.shape  # rows split over "model"
    (2, 4)
    """
    axis_size(mesh, axis)
    rules: list[tuple[str, Spec]] = []
    for pattern, style in (plan or {}).items():
        rules += _linear_rules(pattern, style, axis)
    if defaults:
        rules += [
            ("*.in_proj_weight", PartitionSpec(axis, None)),
            ("*.in_proj_bias", PartitionSpec(axis)),
            ("*.q_proj_weight", PartitionSpec(axis, None)),
            ("*.k_proj_weight", PartitionSpec(axis, None)),
            ("*.v_proj_weight", PartitionSpec(axis, None)),
        ]
        for pattern, style in DEFAULT_TP_PLAN.items():
            rules += _linear_rules(pattern, style, axis)
    return rules
