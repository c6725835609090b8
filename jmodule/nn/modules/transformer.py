"""Transformer layers, as ``torch.nn.Transformer*``.

Same submodule names, parameter names, initialisation and numerics as
PyTorch's reference (non-fast-path) implementation. PyTorch's inference fast
paths (fused kernels, nested tensors) are performance features with no JAX
counterpart; the one visible effect, that ``TransformerEncoder`` in eval mode
under ``torch.no_grad()`` with ``batch_first`` and a key padding mask returns
zeros at padded positions, is not reproduced (those positions hold the
regular computation here, as PyTorch itself gives with autograd on).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jmodule._placement import factory as _factory
from jmodule.nn import functional as F
from jmodule.nn import init
from jmodule.nn.functional._attention import _canonical_mask
from jmodule.nn.functional._utils import compute_dtype
from jmodule.nn.modules.activation import GELU, ReLU
from jmodule.nn.modules.attention import MultiheadAttention
from jmodule.nn.modules.container import ModuleList
from jmodule.nn.modules.dropout import Dropout
from jmodule.nn.modules.linear import Linear
from jmodule.nn.modules.module import Module
from jmodule.nn.modules.normalization import LayerNorm
from jmodule.nn.parameter import as_array

__all__ = [
    "Transformer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerEncoder",
    "TransformerEncoderLayer",
]


def _get_activation_fn(activation: str | Callable) -> Callable:
    if not isinstance(activation, str):
        return activation
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    raise RuntimeError(f"activation should be relu/gelu, not {activation}")


def _relu_or_gelu(activation: Callable) -> int:
    """PyTorch's ``activation_relu_or_gelu`` flag: 1 relu, 2 gelu, 0 other."""
    if activation is F.relu or isinstance(activation, ReLU):
        return 1
    if activation is F.gelu or isinstance(activation, GELU):
        return 2
    return 0


def _get_clones(module: Module, n: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(n)])


def _check_input(x: Any, name: str, d_model: int, batch_first: bool) -> jax.Array:
    x = as_array(x)
    layout = "(N, L, E)" if batch_first else "(L, N, E)"
    if x.ndim not in (2, 3) or x.shape[-1] != d_model:
        raise ValueError(
            f"{name} should be {layout} or unbatched (L, E) with E = d_model = {d_model}; "
            f"got shape {tuple(x.shape)}"
        )
    return x


def _float_mask(mask: Any, name: str, like: jax.Array) -> jax.Array | None:
    return _canonical_mask(mask, name, compute_dtype(like.dtype))


class TransformerEncoderLayer(Module):
    """Self-attention and a feed-forward block, as ``torch.nn.TransformerEncoderLayer``.

    Args:
        d_model: model width.
        nhead: attention heads.
        dim_feedforward: hidden width of the feed-forward block.
        dropout: dropout probability (attention weights and residual branches).
        activation: ``"relu"``, ``"gelu"`` or a callable (a Module is
            registered as the submodule ``activation``, as in PyTorch).
        layer_norm_eps: LayerNorm epsilon.
        batch_first: inputs are ``(N, L, E)`` instead of ``(L, N, E)``.
        norm_first: pre-norm (LayerNorm before each block) instead of post-norm.
        bias: biases in the Linear and LayerNorm layers.
        device, dtype: where and in what dtype to create the parameters.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
    >>> layer(jnp.ones((3, 5, 8))).shape
    (3, 5, 8)
    """

    __constants__ = ["norm_first"]

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = F.relu,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first, **factory
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        activation = _get_activation_fn(activation)
        self.activation_relu_or_gelu = _relu_or_gelu(activation)
        self.activation = activation

    def forward(
        self,
        src: Any,
        src_mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: bool = False,
    ) -> jax.Array:
        """Encode ``src``.

        Args:
            src: ``(L, N, E)`` (``(N, L, E)`` with ``batch_first``) or ``(L, E)``.
            src_mask: ``(L, L)`` or ``(N * nhead, L, L)``; boolean ``True`` =
                not allowed, or float (added).
            src_key_padding_mask: ``(N, L)``; boolean ``True`` = padding.
            is_causal: hint that ``src_mask`` is the causal mask.
        """
        x = _check_input(src, "src", self.self_attn.embed_dim, self.self_attn.batch_first)
        kpm = _float_mask(src_key_padding_mask, "src_key_padding_mask", x)
        mask = _float_mask(src_mask, "src_mask", x)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), mask, kpm, is_causal)
            x = x + self._ff_block(self.norm2(x))
        else:
            x = self.norm1(x + self._sa_block(x, mask, kpm, is_causal))
            x = self.norm2(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Any, mask: Any, kpm: Any, is_causal: bool) -> jax.Array:
        x = self.self_attn(
            x,
            x,
            x,
            attn_mask=mask,
            key_padding_mask=kpm,
            need_weights=False,
            is_causal=is_causal,
        )[0]
        return self.dropout1(x)

    def _ff_block(self, x: Any) -> jax.Array:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerDecoderLayer(Module):
    """Self-attention, cross-attention and feed-forward, as ``torch.nn.TransformerDecoderLayer``.

    Arguments as :class:`TransformerEncoderLayer`.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> layer = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    >>> layer(jnp.ones((4, 2, 8)), jnp.ones((6, 2, 8))).shape
    (4, 2, 8)
    """

    __constants__ = ["norm_first"]

    def __init__(
        self,
        d_model: int,
        nhead: int,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = F.relu,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.self_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, batch_first=batch_first, bias=bias, **factory
        )
        self.multihead_attn = MultiheadAttention(
            d_model, nhead, dropout=dropout, batch_first=batch_first, bias=bias, **factory
        )
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias, **factory)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias, **factory)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.norm3 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _get_activation_fn(activation)

    def forward(
        self,
        tgt: Any,
        memory: Any,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool = False,
        memory_is_causal: bool = False,
    ) -> jax.Array:
        """Decode ``tgt`` attending to ``memory`` (masks as in :class:`Transformer`)."""
        d_model, batch_first = self.self_attn.embed_dim, self.self_attn.batch_first
        x = _check_input(tgt, "tgt", d_model, batch_first)
        memory = _check_input(memory, "memory", d_model, batch_first)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal)
            x = x + self._mha_block(
                self.norm2(x), memory, memory_mask, memory_key_padding_mask, memory_is_causal
            )
            x = x + self._ff_block(self.norm3(x))
        else:
            x = self.norm1(x + self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = self.norm2(
                x
                + self._mha_block(x, memory, memory_mask, memory_key_padding_mask, memory_is_causal)
            )
            x = self.norm3(x + self._ff_block(x))
        return x

    def _sa_block(self, x: Any, mask: Any, kpm: Any, is_causal: bool) -> jax.Array:
        x = self.self_attn(
            x, x, x, attn_mask=mask, key_padding_mask=kpm, is_causal=is_causal, need_weights=False
        )[0]
        return self.dropout1(x)

    def _mha_block(self, x: Any, mem: Any, mask: Any, kpm: Any, is_causal: bool) -> jax.Array:
        x = self.multihead_attn(
            x,
            mem,
            mem,
            attn_mask=mask,
            key_padding_mask=kpm,
            is_causal=is_causal,
            need_weights=False,
        )[0]
        return self.dropout2(x)

    def _ff_block(self, x: Any) -> jax.Array:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout3(x)


class TransformerEncoder(Module):
    """``num_layers`` deep copies of ``encoder_layer`` and an optional final norm.

    Args:
        encoder_layer: the layer to copy (e.g. a :class:`TransformerEncoderLayer`).
        num_layers: how many copies.
        norm: applied to the output, if given.
        enable_nested_tensor, mask_check: accepted and stored for PyTorch
            compatibility; they select PyTorch inference kernels and change
            nothing here (see the module note on padded positions).

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    >>> nn.TransformerEncoder(layer, num_layers=2)(jnp.ones((5, 3, 8))).shape
    (5, 3, 8)
    """

    def __init__(
        self,
        encoder_layer: Module,
        num_layers: int,
        norm: Module | None = None,
        enable_nested_tensor: bool = True,
        mask_check: bool = True,
    ) -> None:
        super().__init__()
        self.layers = _get_clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        self.enable_nested_tensor = enable_nested_tensor
        self.use_nested_tensor = False  # no nested tensors in JAX
        self.mask_check = mask_check

    def forward(
        self,
        src: Any,
        mask: Any = None,
        src_key_padding_mask: Any = None,
        is_causal: bool | None = None,
    ) -> jax.Array:
        """Run ``src`` through every layer (arguments as :class:`TransformerEncoderLayer`).

        ``is_causal=None`` (PyTorch's "detect") passes the mask as given;
        detecting a causal mask only lets PyTorch pick a kernel, the result
        is the same.
        """
        output = as_array(src)
        kpm = _float_mask(src_key_padding_mask, "src_key_padding_mask", output)
        mask = _float_mask(mask, "mask", output)
        for layer in self.layers:
            output = layer(
                output, src_mask=mask, is_causal=bool(is_causal), src_key_padding_mask=kpm
            )
        if self.norm is not None:
            output = self.norm(output)
        return output


class TransformerDecoder(Module):
    """``num_layers`` deep copies of ``decoder_layer`` and an optional final norm.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> layer = nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0)
    >>> nn.TransformerDecoder(layer, 2)(jnp.ones((4, 2, 8)), jnp.ones((6, 2, 8))).shape
    (4, 2, 8)
    """

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None) -> None:
        super().__init__()
        self.layers = _get_clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(
        self,
        tgt: Any,
        memory: Any,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> jax.Array:
        """Run ``tgt`` through every layer, each attending to ``memory``."""
        output = tgt
        for layer in self.layers:
            output = layer(
                output,
                memory,
                tgt_mask=tgt_mask,
                memory_mask=memory_mask,
                tgt_key_padding_mask=tgt_key_padding_mask,
                memory_key_padding_mask=memory_key_padding_mask,
                tgt_is_causal=bool(tgt_is_causal),
                memory_is_causal=memory_is_causal,
            )
        if self.norm is not None:
            output = self.norm(output)
        return output


class Transformer(Module):
    """Encoder-decoder transformer, as ``torch.nn.Transformer``.

    Every parameter with more than one dimension is re-drawn Xavier-uniform
    after construction, as PyTorch does.

    Args:
        d_model, nhead, num_encoder_layers, num_decoder_layers,
        dim_feedforward, dropout, activation, layer_norm_eps, batch_first,
        norm_first, bias, device, dtype: as PyTorch's.
        custom_encoder, custom_decoder: modules used instead of the default
            stacks.

    >>> import jax.numpy as jnp
    >>> from jmodule import nn
    >>> model = nn.Transformer(8, 2, 1, 1, dim_feedforward=16, dropout=0.0)
    >>> model(jnp.ones((5, 2, 8)), jnp.ones((4, 2, 8))).shape
    (4, 2, 8)
    """

    def __init__(
        self,
        d_model: int = 512,
        nhead: int = 8,
        num_encoder_layers: int = 6,
        num_decoder_layers: int = 6,
        dim_feedforward: int = 2048,
        dropout: float = 0.1,
        activation: str | Callable = F.relu,
        custom_encoder: Any = None,
        custom_decoder: Any = None,
        layer_norm_eps: float = 1e-5,
        batch_first: bool = False,
        norm_first: bool = False,
        bias: bool = True,
        device: Any = None,
        dtype: Any = None,
    ) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        layer_args = (d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps)
        layer_kwargs = {"batch_first": batch_first, "norm_first": norm_first, "bias": bias}
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            encoder_layer = TransformerEncoderLayer(*layer_args, **layer_kwargs, **factory)
            encoder_norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
            self.encoder = TransformerEncoder(encoder_layer, num_encoder_layers, encoder_norm)
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            decoder_layer = TransformerDecoderLayer(*layer_args, **layer_kwargs, **factory)
            decoder_norm = LayerNorm(d_model, eps=layer_norm_eps, bias=bias, **factory)
            self.decoder = TransformerDecoder(decoder_layer, num_decoder_layers, decoder_norm)
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def forward(
        self,
        src: Any,
        tgt: Any,
        src_mask: Any = None,
        tgt_mask: Any = None,
        memory_mask: Any = None,
        src_key_padding_mask: Any = None,
        tgt_key_padding_mask: Any = None,
        memory_key_padding_mask: Any = None,
        src_is_causal: bool | None = None,
        tgt_is_causal: bool | None = None,
        memory_is_causal: bool = False,
    ) -> jax.Array:
        """Encode ``src``, then decode ``tgt`` attending to the encoding.

        Args:
            src: ``(S, N, E)`` (``(N, S, E)`` with ``batch_first``) or ``(S, E)``.
            tgt: ``(T, N, E)`` (``(N, T, E)``) or ``(T, E)``.
            src_mask: ``(S, S)``; tgt_mask: ``(T, T)``; memory_mask:
                ``(T, S)`` (or per-head 3-D); boolean ``True`` = not
                allowed, or float (added). See
                :meth:`generate_square_subsequent_mask`.
            src_key_padding_mask: ``(N, S)``; tgt_key_padding_mask:
                ``(N, T)``; memory_key_padding_mask: ``(N, S)``; boolean
                ``True`` = padding.
            src_is_causal, tgt_is_causal, memory_is_causal: hints that the
                corresponding mask is causal.

        Returns:
            ``(T, N, E)`` (or ``(N, T, E)`` / ``(T, E)``).

        Raises:
            RuntimeError: batch sizes or feature sizes disagree (PyTorch's errors).
        """
        src, tgt = as_array(src), as_array(tgt)
        batch_axis = 0 if self.batch_first else 1
        if src.ndim == 3 and (tgt.ndim != 3 or src.shape[batch_axis] != tgt.shape[batch_axis]):
            raise RuntimeError(
                "the batch number of src and tgt must be equal; got src "
                f"{tuple(src.shape)} and tgt {tuple(tgt.shape)} (batch_first={self.batch_first})"
            )
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError(
                f"the feature number of src and tgt must be equal to d_model ({self.d_model}); "
                f"got src {tuple(src.shape)} and tgt {tuple(tgt.shape)}"
            )
        memory = self.encoder(
            src, mask=src_mask, src_key_padding_mask=src_key_padding_mask, is_causal=src_is_causal
        )
        return self.decoder(
            tgt,
            memory,
            tgt_mask=tgt_mask,
            memory_mask=memory_mask,
            tgt_key_padding_mask=tgt_key_padding_mask,
            memory_key_padding_mask=memory_key_padding_mask,
            tgt_is_causal=tgt_is_causal,
            memory_is_causal=memory_is_causal,
        )

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device: Any = None, dtype: Any = None) -> Any:
        """A ``(sz, sz)`` float mask: 0 on and below the diagonal, ``-inf`` above.

        >>> from jmodule import nn
        >>> nn.Transformer.generate_square_subsequent_mask(3)
        Array([[  0., -inf, -inf],
               [  0.,   0., -inf],
               [  0.,   0.,   0.]], dtype=float32)
        """
        full = _factory.full((sz, sz), -jnp.inf, dtype, device)
        if isinstance(full, jax.ShapeDtypeStruct):
            return full
        return jnp.triu(full, k=1)

    def _reset_parameters(self) -> None:
        """Xavier-uniform for every parameter with more than one dimension."""
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
