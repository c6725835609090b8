"""Attention: ``scaled_dot_product_attention`` and ``multi_head_attention_forward``.

Scores, softmax and the weighted sum run in at least float32 (bfloat16 and
float16 inputs are upcast, the result is cast back), as PyTorch's kernels
accumulate. Masks follow PyTorch's two conventions, which are opposite for
booleans: in ``scaled_dot_product_attention`` ``True`` means *may attend*; in
``multi_head_attention_forward`` (and ``MultiheadAttention`` / the Transformer
layers) ``True`` means *masked out*. Float masks are added to the scores in
both.

Rows whose every key is masked: ``scaled_dot_product_attention`` returns zeros
for them (PyTorch's "safe softmax"); ``multi_head_attention_forward`` with
``need_weights=True`` returns NaN there, as PyTorch does.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jmodule import random as _random
from jmodule.nn.functional._basic import linear
from jmodule.nn.functional._utils import autocast, compute_dtype, region_jit
from jmodule.nn.parameter import as_array

__all__ = ["multi_head_attention_forward", "scaled_dot_product_attention"]


def _safe_softmax(scores: jax.Array) -> jax.Array:
    """Softmax over the last axis; rows that are entirely ``-inf`` give zeros (no NaN)."""
    dead = jnp.all(jnp.isneginf(scores), axis=-1, keepdims=True)
    probs = jax.nn.softmax(jnp.where(dead, jnp.zeros((), scores.dtype), scores), axis=-1)
    return jnp.where(dead, jnp.zeros((), probs.dtype), probs)


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def scaled_dot_product_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> jax.Array:
    """``softmax(q @ k.T * scale + mask) @ v``, as PyTorch's ``scaled_dot_product_attention``.

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``.
        value: ``(..., S, Ev)``.
        attn_mask: broadcastable to ``(..., L, S)``; boolean (``True`` = may
            attend) or float (added to the scores).
        dropout_p: dropout on the attention weights (always applied when > 0,
            as in PyTorch: pass 0.0 in evaluation). Draws from the default
            generator.
        is_causal: mask out keys after each query (top-left aligned
            ``tril(ones(L, S))``). Not together with ``attn_mask``, as in
            PyTorch: fold the causal mask into ``attn_mask`` instead.
        scale: score scale; default ``1 / sqrt(E)``.
        enable_gqa: grouped-query attention: ``key``/``value`` heads (axis
            -3) are repeated to match the query's.

    Returns:
        ``(..., L, Ev)`` in the inputs' dtype. Rows with every key masked are 0.

    Raises:
        ValueError: the shapes do not fit together.
        RuntimeError: both ``attn_mask`` and ``is_causal``.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> q = jnp.ones((2, 4, 3, 8))
    >>> F.scaled_dot_product_attention(q, q, q, is_causal=True).shape
    (2, 4, 3, 8)
    """
    q, k, v = as_array(query), as_array(key), as_array(value)
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ValueError(
            "scaled_dot_product_attention expects query (..., L, E), key (..., S, E) and "
            f"value (..., S, Ev); got shapes {_shape(q)}, {_shape(k)} and {_shape(v)}"
        )
    if enable_gqa and q.ndim >= 3 and k.ndim >= 3 and k.shape[-3] != q.shape[-3]:
        heads, kv_heads = q.shape[-3], k.shape[-3]
        if heads % kv_heads or v.ndim < 3 or v.shape[-3] != kv_heads:
            raise ValueError(
                f"enable_gqa: the query's {heads} heads must be a multiple of the key's and "
                f"value's heads; got key {_shape(k)} and value {_shape(v)}"
            )
        k = jnp.repeat(k, heads // kv_heads, axis=-3)
        v = jnp.repeat(v, heads // kv_heads, axis=-3)
    try:
        jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        fits = q.shape[-1] == k.shape[-1] and k.shape[-2] == v.shape[-2]
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(
            "scaled_dot_product_attention: query (..., L, E) and key (..., S, E) must share E, "
            "key and value (..., S, Ev) must share S, and the leading (batch, head) axes must "
            f"broadcast; got shapes {_shape(q)}, {_shape(k)} and {_shape(v)}"
        )
    mask = None if attn_mask is None else as_array(attn_mask)
    q, k, v, mask = autocast("scaled_dot_product_attention", q, k, v, mask)
    if mask is not None and is_causal:
        raise RuntimeError(
            "_scaled_dot_product_attention: Explicit attn_mask should not be set when "
            "is_causal=True. Fold the causal mask into attn_mask instead: "
            "attn_mask & jnp.tril(jnp.ones((L, S), bool)) (boolean) or add "
            "jnp.triu(jnp.full((L, S), -inf), 1) (float)."
        )
    if mask is not None:
        scores_shape = (*jnp.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
        try:
            jnp.broadcast_shapes(mask.shape, scores_shape)
        except ValueError:
            raise ValueError(
                f"attn_mask of shape {_shape(mask)} does not broadcast to the attention scores' "
                f"shape {scores_shape} (..., L, S)"
            ) from None
    if dropout_p < 0.0 or dropout_p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    rng = _random.next_key() if dropout_p > 0.0 else None
    return _sdpa_jit(q, k, v, mask, rng, dropout_p=dropout_p, is_causal=is_causal, scale=scale)


def _dropout(x: jax.Array, p: float, rng: jax.Array | None) -> jax.Array:
    """Dropout with an explicit key (None or ``p == 0``: identity)."""
    if rng is None or p == 0.0:
        return x
    if p >= 1.0:
        return jnp.zeros_like(x)
    keep = jax.random.bernoulli(rng, 1.0 - p, x.shape)
    return jnp.where(keep, x / (1.0 - p), jnp.zeros((), x.dtype))


def _sdpa(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    rng: jax.Array | None,
    *,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
) -> jax.Array:
    """The attention itself, on checked arrays (a pure function of its arguments)."""
    dtype = jnp.result_type(q, k, v)
    compute = compute_dtype(dtype)
    length, src_len = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = jnp.einsum("...le,...se->...ls", q, k, preferred_element_type=compute)
    scores = scores * jnp.asarray(scale, compute)
    allowed = jnp.tril(jnp.ones((length, src_len), bool)) if is_causal else None
    if mask is not None:
        if mask.dtype == jnp.bool_:
            allowed = mask if allowed is None else allowed & mask
        else:
            scores = scores + mask.astype(compute)
    if allowed is not None:
        scores = jnp.where(allowed, scores, jnp.asarray(-jnp.inf, compute))
    weights = _dropout(_safe_softmax(scores), dropout_p, rng)
    out = jnp.einsum("...ls,...sv->...lv", weights, v.astype(compute))
    return out.astype(dtype)


# One compiled program per configuration, so eager calls (and eager gradients)
# do not dispatch and compile each small operation separately.
_sdpa_jit = region_jit(_sdpa, static_argnames=("dropout_p", "is_causal", "scale"))


def _canonical_mask(mask: Any, name: str, compute: Any) -> jax.Array | None:
    """A boolean mask (``True`` = masked out) as an additive float mask."""
    if mask is None:
        return None
    m = as_array(mask)
    if m.dtype == jnp.bool_:
        return jnp.where(m, jnp.asarray(-jnp.inf, compute), jnp.asarray(0.0, compute))
    if not jnp.issubdtype(m.dtype, jnp.floating):
        raise TypeError(f"only bool and floating types of {name} are supported, got {m.dtype}")
    return m.astype(compute)


def _check_shapes(query: Any, key: Any, value: Any, kpm: Any, attn_mask: Any, heads: int) -> bool:
    """PyTorch's rank checks; returns whether the input is batched."""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise ValueError(
                "For batched (3-D) `query`, expected `key` and `value` to be 3-D but found "
                f"{key.ndim}-D and {value.ndim}-D tensors respectively"
            )
        if kpm is not None and kpm.ndim != 2:
            raise ValueError(
                "For batched (3-D) `query`, expected `key_padding_mask` to be `None` or 2-D "
                f"but found {kpm.ndim}-D tensor instead"
            )
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise ValueError(
                "For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or 3-D "
                f"but found {attn_mask.ndim}-D tensor instead"
            )
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise ValueError(
                "For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but found "
                f"{key.ndim}-D and {value.ndim}-D tensors respectively"
            )
        if kpm is not None and kpm.ndim != 1:
            raise ValueError(
                "For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` or 1-D "
                f"but found {kpm.ndim}-D tensor instead"
            )
        if attn_mask is not None:
            if attn_mask.ndim not in (2, 3):
                raise ValueError(
                    "For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D or "
                    f"3-D but found {attn_mask.ndim}-D tensor instead"
                )
            expected = (heads, query.shape[0], key.shape[0])
            if attn_mask.ndim == 3 and tuple(attn_mask.shape) != expected:
                raise ValueError(
                    f"Expected `attn_mask` shape to be {expected} but got {_shape(attn_mask)}"
                )
        return False
    raise ValueError(
        "query should be unbatched 2D (L, E) or batched 3D (L, N, E) but received a "
        f"{query.ndim}-D query of shape {_shape(query)}"
    )


def _in_projection(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    w_q: Any,
    w_k: Any,
    w_v: Any,
    b: Any,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    b_q, b_k, b_v = (None, None, None) if b is None else jnp.split(as_array(b), 3)
    return linear(query, w_q, b_q), linear(key, w_k, b_k), linear(value, w_v, b_v)


def multi_head_attention_forward(
    query: Any,
    key: Any,
    value: Any,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Any,
    in_proj_bias: Any,
    bias_k: Any,
    bias_v: Any,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Any,
    out_proj_bias: Any,
    training: bool = True,
    key_padding_mask: Any = None,
    need_weights: bool = True,
    attn_mask: Any = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Any = None,
    k_proj_weight: Any = None,
    v_proj_weight: Any = None,
    static_k: Any = None,
    static_v: Any = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
    """Multi-head attention on ``(L, N, E)`` inputs, as PyTorch's function of the same name.

    The computation behind ``MultiheadAttention``: in-projection, optional
    ``bias_k``/``bias_v`` and zero-attention key, masks merged (boolean
    ``True`` = masked out, floats added), attention per head, out-projection.

    Returns:
        ``(output (L, N, E), weights)``: weights are ``(N, L, S)`` averaged
        over heads, ``(N, num_heads, L, S)`` when ``average_attn_weights`` is
        False, or None when ``need_weights`` is False. Unbatched ``(L, E)``
        inputs give unbatched outputs.

    Raises:
        ValueError: shapes or masks that do not fit (the message names both).
        RuntimeError: ``is_causal`` without ``attn_mask``, as in PyTorch.

    >>> import jax.numpy as jnp
    >>> import jmodule.nn.functional as F
    >>> x = jnp.ones((3, 2, 4))
    >>> w, b = jnp.ones((12, 4)), jnp.zeros(12)
    >>> out, attn = F.multi_head_attention_forward(
    ...     x, x, x, 4, 2, w, b, None, None, False, 0.0, jnp.eye(4), None
    ... )
    >>> out.shape, attn.shape
    ((3, 2, 4), (2, 3, 3))
    """
    packed = query is key and key is value and not use_separate_proj_weight

    def arr(x: Any) -> Any:
        return None if x is None else as_array(x)

    q_in = as_array(query)
    k_in = q_in if packed else as_array(key)
    v_in = q_in if packed else as_array(value)
    kpm, mask = arr(key_padding_mask), arr(attn_mask)
    batched = _check_shapes(q_in, k_in, v_in, kpm, mask, num_heads)
    if is_causal and mask is None:
        raise RuntimeError(
            "Need attn_mask if specifying the is_causal hint. You may use the Transformer "
            "module method `generate_square_subsequent_mask` to create this mask."
        )
    if dropout_p < 0.0 or dropout_p > 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {dropout_p}")
    dropout_p = dropout_p if training else 0.0
    rng = _random.next_key() if dropout_p > 0.0 else None
    weights = {
        "in_proj_weight": arr(in_proj_weight),
        "in_proj_bias": arr(in_proj_bias),
        "bias_k": arr(bias_k),
        "bias_v": arr(bias_v),
        "out_proj_weight": arr(out_proj_weight),
        "out_proj_bias": arr(out_proj_bias),
        "q_proj_weight": arr(q_proj_weight),
        "k_proj_weight": arr(k_proj_weight),
        "v_proj_weight": arr(v_proj_weight),
        "static_k": arr(static_k),
        "static_v": arr(static_v),
    }
    return _mha_jit(
        q_in,
        None if packed else k_in,
        None if packed else v_in,
        kpm,
        mask,
        weights,
        rng,
        embed_dim_to_check=embed_dim_to_check,
        num_heads=num_heads,
        add_zero_attn=add_zero_attn,
        dropout_p=dropout_p,
        need_weights=need_weights,
        use_separate_proj_weight=use_separate_proj_weight,
        average_attn_weights=average_attn_weights,
        is_causal=is_causal,
        batched=batched,
    )


def _mha(
    q_in: jax.Array,
    k_in: jax.Array | None,
    v_in: jax.Array | None,
    kpm: jax.Array | None,
    mask: jax.Array | None,
    weights: dict[str, Any],
    rng: jax.Array | None,
    *,
    embed_dim_to_check: int,
    num_heads: int,
    add_zero_attn: bool,
    dropout_p: float,
    need_weights: bool,
    use_separate_proj_weight: bool,
    average_attn_weights: bool,
    is_causal: bool,
    batched: bool,
) -> tuple[jax.Array, jax.Array | None]:
    """The computation of :func:`multi_head_attention_forward` on checked arrays.

    ``k_in``/``v_in`` are None for self-attention with packed weights (one
    projection of ``q_in``).
    """
    packed = k_in is None
    if packed:
        k_in = v_in = q_in
    in_proj_weight, in_proj_bias = weights["in_proj_weight"], weights["in_proj_bias"]
    bias_k, bias_v = weights["bias_k"], weights["bias_v"]
    static_k, static_v = weights["static_k"], weights["static_v"]
    if not batched:
        q_in, k_in, v_in = q_in[:, None], k_in[:, None], v_in[:, None]
        kpm = None if kpm is None else kpm[None]
    tgt_len, bsz, embed_dim = q_in.shape
    compute = compute_dtype(q_in.dtype)
    kpm = _canonical_mask(kpm, "key_padding_mask", compute)
    if is_causal and kpm is None and not need_weights:
        mask = None  # PyTorch trusts the hint and applies a causal mask instead.
    else:
        mask = _canonical_mask(mask, "attn_mask", compute)
        if kpm is not None:
            is_causal = False
    if embed_dim != embed_dim_to_check:
        raise ValueError(
            f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim} "
            f"(query shape {_shape(q_in)})"
        )
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise ValueError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if k_in.shape[:2] != v_in.shape[:2]:
            raise ValueError(
                f"key's sequence and batch dims {_shape(k_in)[:2]} do not match value's "
                f"{_shape(v_in)[:2]}"
            )
        q, k, v = _in_projection(
            q_in,
            k_in,
            v_in,
            weights["q_proj_weight"],
            weights["k_proj_weight"],
            weights["v_proj_weight"],
            in_proj_bias,
        )
    else:
        if k_in.shape != v_in.shape:
            raise ValueError(f"key shape {_shape(k_in)} does not match value shape {_shape(v_in)}")
        if packed:  # self-attention: one projection
            q, k, v = jnp.split(linear(q_in, in_proj_weight, in_proj_bias), 3, axis=-1)
        else:
            w_q, w_k, w_v = jnp.split(as_array(in_proj_weight), 3)
            q, k, v = _in_projection(q_in, k_in, v_in, w_q, w_k, w_v, in_proj_bias)
    src_len = k_in.shape[0]

    # Masks as (1 or N, 1 or H, L, S) additive floats.
    if mask is not None:
        if mask.ndim == 2:
            if mask.shape != (tgt_len, src_len):
                raise ValueError(
                    f"The shape of the 2D attn_mask is {_shape(mask)}, but should be "
                    f"{(tgt_len, src_len)}."
                )
            mask = mask[None, None]
        else:
            if mask.shape != (bsz * num_heads, tgt_len, src_len):
                raise ValueError(
                    f"The shape of the 3D attn_mask is {_shape(mask)}, but should be "
                    f"{(bsz * num_heads, tgt_len, src_len)}."
                )
            mask = mask.reshape(bsz, num_heads, tgt_len, src_len)
    pad_key = jnp.zeros((1, 1, 1, 1), compute)

    def pad_masks(mask: Any, kpm: Any) -> tuple[Any, Any]:
        if mask is not None:
            mask = jnp.concatenate([mask, jnp.broadcast_to(pad_key, (*mask.shape[:-1], 1))], -1)
        if kpm is not None:
            kpm = jnp.concatenate([kpm, jnp.zeros((kpm.shape[0], 1), compute)], -1)
        return mask, kpm

    if bias_k is not None and bias_v is not None:
        if static_k is not None or static_v is not None:
            raise ValueError("bias_k/bias_v cannot be added to a static key or value.")
        k = jnp.concatenate([k, jnp.broadcast_to(as_array(bias_k), (1, bsz, embed_dim))])
        v = jnp.concatenate([v, jnp.broadcast_to(as_array(bias_v), (1, bsz, embed_dim))])
        mask, kpm = pad_masks(mask, kpm)
    elif bias_k is not None or bias_v is not None:
        raise ValueError("bias_k and bias_v must be given together")

    # (S, N, E) -> (N, H, S, head_dim)
    def heads(x: jax.Array) -> jax.Array:
        return x.reshape(x.shape[0], bsz, num_heads, head_dim).transpose(1, 2, 0, 3)

    def static(x: Any, name: str) -> jax.Array:
        x = as_array(x)
        if x.ndim != 3 or x.shape[0] != bsz * num_heads or x.shape[2] != head_dim:
            raise ValueError(
                f"expecting {name} of shape (N*num_heads, S, head_dim) = "
                f"({bsz * num_heads}, S, {head_dim}), but got {_shape(x)}"
            )
        return x.reshape(bsz, num_heads, x.shape[1], head_dim)

    q = heads(q)
    k = heads(k) if static_k is None else static(static_k, "static_k")
    v = heads(v) if static_v is None else static(static_v, "static_v")
    if add_zero_attn:
        k = jnp.concatenate([k, jnp.zeros((*k.shape[:2], 1, head_dim), k.dtype)], axis=2)
        v = jnp.concatenate([v, jnp.zeros((*v.shape[:2], 1, head_dim), v.dtype)], axis=2)
        mask, kpm = pad_masks(mask, kpm)
    src_len = k.shape[2]
    if kpm is not None:
        if kpm.shape != (bsz, src_len):
            raise ValueError(
                f"expected key_padding_mask of shape {(bsz, src_len)} (N, S), but got {_shape(kpm)}"
            )
        kpm = kpm[:, None, None, :]
        mask = kpm if mask is None else mask + kpm
    if need_weights:
        scores = jnp.einsum("nhle,nhse->nhls", q, k, preferred_element_type=compute)
        scores = scores * jnp.asarray(math.sqrt(1.0 / head_dim), compute)
        if mask is not None:
            scores = scores + mask
        attn = _dropout(jax.nn.softmax(scores, axis=-1), dropout_p, rng)  # all masked: NaN
        out = jnp.einsum("nhls,nhse->nhle", attn, v.astype(compute)).astype(q.dtype)
    else:
        out = _sdpa(q, k, v, mask, rng, dropout_p=dropout_p, is_causal=is_causal, scale=None)
        attn = None
    out = out.transpose(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
    out = linear(out, weights["out_proj_weight"], weights["out_proj_bias"])
    if attn is not None:
        attn = (attn.mean(axis=1) if average_attn_weights else attn).astype(q.dtype)
    if not batched:
        out = out[:, 0]
        attn = None if attn is None else attn[0]
    return out, attn


_MHA_STATIC = (
    "embed_dim_to_check",
    "num_heads",
    "add_zero_attn",
    "dropout_p",
    "need_weights",
    "use_separate_proj_weight",
    "average_attn_weights",
    "is_causal",
    "batched",
)
_mha_jit = region_jit(_mha, static_argnames=_MHA_STATIC)
