"""``MultiheadAttention``, with PyTorch's parameters, masks and layouts."""

from __future__ import annotations

from typing import Any

import jax

from jmodule._placement import factory as _factory
from jmodule.nn import init
from jmodule.nn.functional._attention import multi_head_attention_forward
from jmodule.nn.modules.linear import Linear
from jmodule.nn.modules.module import Module
from jmodule.nn.parameter import Parameter, as_array

__all__ = ["MultiheadAttention", "NonDynamicallyQuantizableLinear"]


class NonDynamicallyQuantizableLinear(Linear):
    """``Linear`` under the name PyTorch gives ``MultiheadAttention.out_proj``.

    It exists so that ``repr`` matches PyTorch's; it behaves exactly as Linear.

    >>> import jax.numpy as jnp
    >>> from jmodule.nn.modules.attention import NonDynamicallyQuantizableLinear
    >>> NonDynamicallyQuantizableLinear(4, 2)(jnp.ones((1, 4))).shape
    (1, 2)
    """


class MultiheadAttention(Module):
    """Multi-head attention, as ``torch.nn.MultiheadAttention``.

    Inputs are ``(L, N, E)`` (``(N, L, E)`` with ``batch_first``) or
    unbatched ``(L, E)``. Parameters: ``in_proj_weight (3E, E)`` and
    ``in_proj_bias (3E,)`` when ``kdim == vdim == embed_dim``, else
    ``q_proj_weight``/``k_proj_weight``/``v_proj_weight``; ``out_proj``;
    ``bias_k``/``bias_v (1, 1, E)`` with ``add_bias_kv``. Initialised as in
    PyTorch (Xavier-uniform projections, zero biases, Xavier-normal
    ``bias_k``/``bias_v``).

    Args:
        embed_dim: model width E.
        num_heads: heads; must divide ``embed_dim``.
        dropout: dropout on the attention weights (training mode only).
        bias: projection biases.
        add_bias_kv: learn one extra key and value appended to the sequence.
        add_zero_attn: append an all-zero key and value.
        kdim, vdim: key and value widths (default ``embed_dim``).
        batch_first: inputs and outputs are ``(N, L, E)``.
        device, dtype: where and in what dtype to create the parameters.

    Raises:
        ValueError: non-positive sizes, or ``embed_dim`` not divisible by
            ``num_heads``.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> mha = nn.MultiheadAttention(8, 2, batch_first=True)
    >>> x = jnp.ones((3, 5, 8))
    >>> out, weights = mha(x, x, x)
    >>> out.shape, weights.shape
    ((3, 5, 8), (3, 5, 5))
    """

    __constants__ = ["batch_first"]

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = False,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(
                f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} "
                f"and num_heads={num_heads} instead"
            )
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise ValueError(
                f"embed_dim must be divisible by num_heads, got embed_dim={embed_dim} and "
                f"num_heads={num_heads}"
            )

        def new(*shape: int) -> Parameter:
            return Parameter(_factory.empty(shape, dtype, device))

        if not self._qkv_same_embed_dim:
            self.q_proj_weight = new(embed_dim, embed_dim)
            self.k_proj_weight = new(embed_dim, self.kdim)
            self.v_proj_weight = new(embed_dim, self.vdim)
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = new(3 * embed_dim, embed_dim)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = new(3 * embed_dim)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(
            embed_dim, embed_dim, bias=bias, device=device, dtype=dtype
        )
        if add_bias_kv:
            self.bias_k = new(1, 1, embed_dim)
            self.bias_v = new(1, 1, embed_dim)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        """Re-draw the parameters from PyTorch's default distributions."""
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(
        self,
        query: Any,
        key: Any,
        value: Any,
        key_padding_mask: Any = None,
        need_weights: bool = True,
        attn_mask: Any = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[jax.Array, jax.Array | None]:
        """Attend from ``query`` to ``key``/``value``.

        Args:
            query: ``(L, N, E)``, ``(N, L, E)`` with ``batch_first``, or ``(L, E)``.
            key: ``(S, N, kdim)`` (or batch-first / unbatched likewise).
            value: ``(S, N, vdim)``.
            key_padding_mask: ``(N, S)``; boolean ``True`` = ignore that key,
                or float (added).
            need_weights: also return the attention weights.
            attn_mask: ``(L, S)`` or ``(N * num_heads, L, S)``; boolean
                ``True`` = not allowed, or float (added).
            average_attn_weights: average the returned weights over heads.
            is_causal: hint that ``attn_mask`` is the causal mask (which
                must still be given, as in PyTorch).

        Returns:
            ``(output, weights)``: output shaped like ``query`` with
            ``embed_dim`` features; weights ``(N, L, S)`` (or
            ``(N, num_heads, L, S)``), or None without ``need_weights``.
        """
        # As arrays, keeping identities (query is key is value): self-attention
        # then uses one packed projection, as in PyTorch.
        same_kv = key is value
        same_qk = query is key
        query = as_array(query)
        key = query if same_qk else as_array(key)
        value = key if same_kv else as_array(value)
        batched = query.ndim == 3
        if self.batch_first and batched:
            if key is value:
                if query is key:
                    query = key = value = query.swapaxes(0, 1)
                else:
                    query, key = query.swapaxes(0, 1), key.swapaxes(0, 1)
                    value = key
            else:
                query, key, value = (x.swapaxes(0, 1) for x in (query, key, value))
        same = self._qkv_same_embed_dim
        out, weights = multi_head_attention_forward(
            query,
            key,
            value,
            self.embed_dim,
            self.num_heads,
            self.in_proj_weight,
            self.in_proj_bias,
            self.bias_k,
            self.bias_v,
            self.add_zero_attn,
            self.dropout,
            self.out_proj.weight,
            self.out_proj.bias,
            training=self.training,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            attn_mask=attn_mask,
            use_separate_proj_weight=not same,
            q_proj_weight=None if same else self.q_proj_weight,
            k_proj_weight=None if same else self.k_proj_weight,
            v_proj_weight=None if same else self.v_proj_weight,
            average_attn_weights=average_attn_weights,
            is_causal=is_causal,
        )
        if self.batch_first and batched:
            out = out.swapaxes(0, 1)
        return out, weights
