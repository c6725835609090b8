"""jm.nn.utils.rnn (padding and packing) and packed RNN/LSTM/GRU, against PyTorch live.

Every value, layout, error and gradient is compared with torch.nn.utils.rnn and
torch.nn.RNN/LSTM/GRU on the same data and weights, eagerly and inside
jm.compile; lengths are host data (static when compiled, TypeError when traced).
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule.nn.utils import rnn as jrnn

trnn = torch.nn.utils.rnn

IN, H = 3, 4
# Unsorted, with a tie: sorting must be torch's (stable) order.
LENGTHS = [3, 5, 1, 3]


def _np(x):
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    return np.asarray(x)


def _close(got, want, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(_np(got), _np(want), rtol=rtol, atol=atol)


def _same_layout(got, want):
    assert isinstance(got, jrnn.PackedSequence)
    assert got._fields == want._fields
    np.testing.assert_array_equal(got.batch_sizes, want.batch_sizes.numpy())
    assert got.batch_sizes.dtype == np.int64
    for name in ("sorted_indices", "unsorted_indices"):
        g, w = getattr(got, name), getattr(want, name)
        assert (g is None) == (w is None), name
        if w is not None:
            np.testing.assert_array_equal(g, w.numpy())


def _padded(lengths, trailing=(IN,), seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((max(lengths), len(lengths), *trailing)) * 2).astype(dtype)


def _seqs(lengths, trailing=(2,), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, *trailing)).astype(np.float32) for n in lengths]


# ---------------------------------------------------------------------------- utilities


@pytest.mark.torch
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_matches_torch(batch_first, padding_side):
    seqs = _seqs([2, 4, 1], trailing=(2, 3))
    want = trnn.pad_sequence([torch.from_numpy(s) for s in seqs], batch_first, -1.5, padding_side)
    got = jrnn.pad_sequence([jnp.asarray(s) for s in seqs], batch_first, -1.5, padding_side)
    _close(got, want, rtol=0, atol=0)


@pytest.mark.torch
def test_pad_sequence_dtype_broadcast_and_array_input_like_torch():
    # The first sequence's dtype wins; padding_value is cast to it; smaller trailing
    # shapes broadcast; an array is iterated over its first dimension.
    ints = [np.arange(3), np.ones(2)]
    want = trnn.pad_sequence([torch.from_numpy(a) for a in ints], padding_value=1.5)
    got = jrnn.pad_sequence([jnp.asarray(a, jnp.int32) for a in ints], padding_value=1.5)
    assert jnp.issubdtype(got.dtype, jnp.integer) and not want.dtype.is_floating_point
    np.testing.assert_array_equal(got, want.numpy())
    mixed = [np.ones((2, 3), np.float32), np.full((3, 1), 2.0, np.float32)]
    want = trnn.pad_sequence([torch.from_numpy(a) for a in mixed])
    _close(jrnn.pad_sequence([jnp.asarray(a) for a in mixed]), want, rtol=0, atol=0)
    block = np.arange(6, dtype=np.float32).reshape(2, 3)
    want = trnn.pad_sequence(torch.from_numpy(block), batch_first=True)
    _close(jrnn.pad_sequence(jnp.asarray(block), batch_first=True), want, rtol=0, atol=0)


LENGTH_KINDS = {
    "list": list,
    "tuple": tuple,
    "numpy": lambda v: np.asarray(v),
    "jax": lambda v: jnp.asarray(v),
    "torch": lambda v: torch.tensor(v),
}


@pytest.mark.torch
@pytest.mark.parametrize("kind", list(LENGTH_KINDS))
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_padded_sequence_unsorted_matches_torch(kind, batch_first):
    x = _padded(LENGTHS, trailing=(IN, 2))
    if batch_first:
        x = np.ascontiguousarray(x.swapaxes(0, 1))
    want = trnn.pack_padded_sequence(
        torch.from_numpy(x), LENGTHS, batch_first=batch_first, enforce_sorted=False
    )
    got = jrnn.pack_padded_sequence(
        jnp.asarray(x), LENGTH_KINDS[kind](LENGTHS), batch_first=batch_first, enforce_sorted=False
    )
    _same_layout(got, want)
    _close(got.data, want.data, rtol=0, atol=0)


@pytest.mark.torch
@pytest.mark.parametrize("batch_first", [False, True])
def test_pack_padded_sequence_sorted_matches_torch(batch_first):
    lengths = sorted(LENGTHS, reverse=True)
    x = _padded(lengths)
    if batch_first:
        x = np.ascontiguousarray(x.swapaxes(0, 1))
    want = trnn.pack_padded_sequence(torch.from_numpy(x), lengths, batch_first)
    got = jrnn.pack_padded_sequence(jnp.asarray(x), lengths, batch_first)
    _same_layout(got, want)
    assert got.sorted_indices is None and got.unsorted_indices is None
    _close(got.data, want.data, rtol=0, atol=0)


@pytest.mark.torch
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("total_length", [None, 7])
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pad_packed_sequence_matches_torch(batch_first, total_length, enforce_sorted):
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    x = torch.from_numpy(_padded(lengths))
    tp = trnn.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    jp = jrnn.pack_padded_sequence(jnp.asarray(x.numpy()), lengths, enforce_sorted=enforce_sorted)
    want, want_len = trnn.pad_packed_sequence(tp, batch_first, 9.0, total_length)
    got, got_len = jrnn.pad_packed_sequence(jp, batch_first, 9.0, total_length)
    _close(got, want, rtol=0, atol=0)
    np.testing.assert_array_equal(got_len, want_len.numpy())
    assert got_len.dtype == np.int64


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("enforce_sorted", [True, False])
def test_pack_unpack_and_unpad_sequence_match_torch(enforce_sorted):
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    seqs = _seqs(lengths)
    tp = trnn.pack_sequence([torch.from_numpy(s) for s in seqs], enforce_sorted)
    jp = jrnn.pack_sequence([jnp.asarray(s) for s in seqs], enforce_sorted)
    _same_layout(jp, tp)
    _close(jp.data, tp.data, rtol=0, atol=0)
    for g, w in zip(jrnn.unpack_sequence(jp), trnn.unpack_sequence(tp), strict=True):
        _close(g, w, rtol=0, atol=0)
    padded = _padded(lengths)
    want = trnn.unpad_sequence(torch.from_numpy(padded.copy()), torch.tensor(lengths))
    got = jrnn.unpad_sequence(jnp.asarray(padded), lengths)
    for g, w in zip(got, want, strict=True):
        _close(g, w, rtol=0, atol=0)
    bf = np.ascontiguousarray(padded.swapaxes(0, 1))
    want = trnn.unpad_sequence(torch.from_numpy(bf), torch.tensor(lengths), batch_first=True)
    for g, w in zip(jrnn.unpad_sequence(bf, lengths, batch_first=True), want, strict=True):
        _close(g, w, rtol=0, atol=0)


@pytest.mark.torch
def test_packed_sequence_constructor_and_invert_permutation_like_torch():
    data = np.arange(5, dtype=np.float32)
    for args, kwargs in [
        ((data, [2, 2, 1]), {}),
        (((data, [2, 2, 1]),), {"sorted_indices": [1, 0]}),
        ((data, [2, 2, 1], [1, 0], [1, 0]), {}),
    ]:
        to_torch = [
            (torch.from_numpy(a[0]), torch.tensor(a[1])) if isinstance(a, tuple)
            else torch.from_numpy(a) if isinstance(a, np.ndarray) else torch.tensor(a)
            for a in args
        ]  # fmt: skip
        tkw = {k: torch.tensor(v) for k, v in kwargs.items()}
        want = trnn.PackedSequence(*to_torch, **tkw)
        got = jrnn.PackedSequence(*args, **kwargs)
        _same_layout(got, want)
        data_, batch_sizes, *_ = got  # a 4-tuple, as torch's
        _close(data_, want.data, rtol=0, atol=0)
        assert batch_sizes is got.batch_sizes
    perm = [3, 0, 2, 1]
    np.testing.assert_array_equal(
        jrnn.invert_permutation(np.asarray(perm)), trnn.invert_permutation(torch.tensor(perm))
    )
    assert jrnn.invert_permutation(None) is None
    traced = jax.jit(jrnn.invert_permutation)(jnp.asarray(perm))
    np.testing.assert_array_equal(traced, trnn.invert_permutation(torch.tensor(perm)))


@pytest.mark.torch
def test_packed_sequence_to_and_casts():
    packed = jrnn.pack_sequence([jnp.ones((2, 3)), jnp.ones((1, 3))])
    assert packed.to(jnp.float32) is packed  # nothing changes: self, as torch
    half = packed.half()
    assert half.data.dtype == jnp.float16
    np.testing.assert_array_equal(half.batch_sizes, packed.batch_sizes)
    assert packed.int().data.dtype == jnp.int32
    assert packed.to("cpu", dtype=jnp.bfloat16).data.dtype == jnp.bfloat16
    assert packed.to(torch.float16).data.dtype == jnp.float16
    assert not packed.is_cuda or jax.default_backend() == "gpu"


def _torch_error(fn):
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(trnn, torch.from_numpy)
    return info.value


def _jm_error(fn, kind):
    with pytest.raises(kind) as info:
        fn(jrnn, jnp.asarray)
    return info.value


X3 = np.zeros((4, 3, 2), np.float32)
SAME_MESSAGE = {
    "unsorted-enforce_sorted": lambda r, a: r.pack_padded_sequence(a(X3), [2, 3, 1]),
    "len-mismatch": lambda r, a: r.pack_padded_sequence(a(X3), [3, 2]),
    "zero-length": lambda r, a: r.pack_padded_sequence(a(X3), [3, 2, 0]),
    "zero-length-unsorted": lambda r, a: r.pack_padded_sequence(
        a(X3), [0, 3, 2], enforce_sorted=False
    ),
    "negative-length": lambda r, a: r.pack_padded_sequence(a(X3), [3, 2, -1]),
    "1d-input": lambda r, a: r.pack_padded_sequence(a(np.zeros(4, np.float32)), [3]),
    "pack_sequence-unsorted": lambda r, a: r.pack_sequence(
        [a(np.ones(2, np.float32)), a(np.ones(3, np.float32))]
    ),
    "total_length-short": lambda r, a: r.pad_packed_sequence(
        r.pack_sequence([a(np.ones(3, np.float32))]), total_length=2
    ),
    "padding_side": lambda r, a: r.pad_sequence([a(np.ones(2, np.float32))], padding_side="middle"),
    "empty": lambda r, a: r.pad_sequence([]),
    "not-iterable": lambda r, a: r.pad_sequence(5),
    "trailing-mismatch": lambda r, a: r.pad_sequence(
        [a(np.ones((2, 3), np.float32)), a(np.ones((3, 4), np.float32))]
    ),
    "constructor-not-a-pair": lambda r, a: r.PackedSequence(a(np.ones(3, np.float32))),
    "unpad-lengths-longer": lambda r, a: r.unpad_sequence(
        a(np.ones((3, 2, 1), np.float32)), [3, 1, 2] if r is jrnn else torch.tensor([3, 1, 2])
    ),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", list(SAME_MESSAGE))
def test_errors_match_torch(name):
    expected = _torch_error(SAME_MESSAGE[name])
    got = _jm_error(SAME_MESSAGE[name], type(expected))
    assert str(got) == str(expected)


@pytest.mark.torch
def test_lengths_longer_than_input_and_2d_lengths_raise():
    # PyTorch reads past the end of the input for a too-long length; jmodule refuses.
    with pytest.raises(RuntimeError, match="longer than the padded input"):
        jrnn.pack_padded_sequence(jnp.zeros((4, 3, 2)), [5, 2, 1])
    expected = _torch_error(lambda r, a: r.pack_padded_sequence(a(X3), torch.tensor([[3, 2, 1]])))
    with pytest.raises(type(expected), match="should be a 1D"):
        jrnn.pack_padded_sequence(jnp.asarray(X3), [[3, 2, 1]])


# ---------------------------------------------------------------------------- pytree, compile


@pytest.mark.torch
def test_packed_sequence_is_a_pytree_with_a_static_layout():
    packed = jrnn.pack_padded_sequence(jnp.asarray(_padded(LENGTHS)), LENGTHS, enforce_sorted=False)
    leaves, treedef = jax.tree_util.tree_flatten(packed)
    assert len(leaves) == 1 and leaves[0] is packed.data
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    _same_layout(again, trnn.pack_padded_sequence(
        torch.from_numpy(_padded(LENGTHS)), LENGTHS, enforce_sorted=False
    ))  # fmt: skip
    doubled = jax.jit(lambda p: p._replace(data=p.data * 2))(packed)
    assert isinstance(doubled, jrnn.PackedSequence)
    np.testing.assert_array_equal(doubled.batch_sizes, packed.batch_sizes)
    _close(doubled.data, packed.data * 2, rtol=0, atol=0)
    padded, lengths = jax.jit(jrnn.pad_packed_sequence)(packed)
    eager, eager_lengths = jrnn.pad_packed_sequence(packed)
    _close(padded, eager, rtol=0, atol=0)
    np.testing.assert_array_equal(lengths, eager_lengths)
    assert jax.tree_util.tree_structure(packed) == treedef  # same layout, same program


@pytest.mark.torch
def test_compiled_packing_from_static_lengths_matches_torch():
    x = _padded(LENGTHS)
    want = trnn.pad_packed_sequence(
        trnn.pack_padded_sequence(torch.from_numpy(x), LENGTHS, enforce_sorted=False),
        padding_value=-3.0,
    )[0]

    @jm.compile
    def roundtrip(x, lengths):
        packed = jrnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        return packed, jrnn.pad_packed_sequence(packed, padding_value=-3.0)[0]

    packed, got = roundtrip(jnp.asarray(x), LENGTHS)
    assert isinstance(packed, jrnn.PackedSequence)
    _close(got, want, rtol=0, atol=0)
    # A numpy array built inside the function is static too.
    inside = jm.compile(lambda x: jrnn.pack_padded_sequence(x, np.array(LENGTHS), False, False))
    _close(inside(jnp.asarray(x)).data, packed.data, rtol=0, atol=0)


def test_traced_lengths_raise_a_clear_error():
    x = jnp.asarray(_padded(LENGTHS))
    compiled = jm.compile(lambda x, n: jrnn.pack_padded_sequence(x, n, enforce_sorted=False))
    with pytest.raises(TypeError, match=r"host data.*Python list.*lengths.tolist\(\)"):
        compiled(x, np.asarray(LENGTHS))  # a numpy argument of jm.compile is traced
    with pytest.raises(TypeError, match="traced"):
        jax.jit(lambda n: jrnn.pack_padded_sequence(x, n, enforce_sorted=False))(
            jnp.asarray(LENGTHS)
        )
    with pytest.raises(TypeError, match="batch_sizes is a traced array"):
        jax.jit(lambda b: jrnn.PackedSequence(jnp.ones(3), b))(jnp.asarray([2, 1]))
    with pytest.raises(TypeError, match="traced"):
        jax.jit(lambda n: jrnn.unpad_sequence(x, n))(jnp.asarray(LENGTHS))


# ---------------------------------------------------------------------------- packed RNNs

RNN_CASES = {
    "RNN-relu-2layers-bidirectional": (
        "RNN", {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True}, False
    ),
    "GRU-batch_first-h0": ("GRU", {"batch_first": True, "num_layers": 2}, True),
    "LSTM-proj-2layers-bidirectional-h0": (
        "LSTM", {"num_layers": 2, "bidirectional": True, "proj_size": 2}, True
    ),
    "LSTM-bias=False": ("LSTM", {"bias": False}, False),
}  # fmt: skip


def _pair(name, kwargs, seed=0):
    torch.manual_seed(seed)
    ref = getattr(torch.nn, name)(IN, H, **kwargs)
    ours = getattr(jm.nn, name)(IN, H, **kwargs)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _hidden(ref, name, batch, seed=1):
    rng = np.random.default_rng(seed)
    d = (2 if ref.bidirectional else 1) * ref.num_layers
    h = rng.standard_normal((d, batch, ref.proj_size or H)).astype(np.float32)
    if name == "LSTM":
        return h, rng.standard_normal((d, batch, H)).astype(np.float32)
    return h


def _loss(out, hidden):
    # Weights every element differently, so a misplaced row or state shows.
    data = out.data
    w = np.linspace(-1.0, 2.0, int(np.prod(data.shape)), dtype=np.float32).reshape(data.shape)
    total = (data * (torch.from_numpy(w) if isinstance(data, torch.Tensor) else w)).sum()
    for i, h in enumerate(hidden if isinstance(hidden, tuple) else (hidden,)):
        total = total + ((i + 2) * h * h).sum()
    return total


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("enforce_sorted", [False, True])
@pytest.mark.parametrize("case", list(RNN_CASES))
def test_packed_rnn_output_states_and_gradients_match_torch(case, enforce_sorted):
    name, kwargs, with_h0 = RNN_CASES[case]
    lengths = sorted(LENGTHS, reverse=True) if enforce_sorted else LENGTHS
    ref, ours = _pair(name, kwargs)
    x = _padded(lengths)
    bf = kwargs.get("batch_first", False)
    if bf:
        x = np.ascontiguousarray(x.swapaxes(0, 1))
    tx = torch.from_numpy(x).requires_grad_(True)
    t_packed = trnn.pack_padded_sequence(tx, lengths, bf, enforce_sorted)
    h0 = _hidden(ref, name, len(lengths)) if with_h0 else None
    t_h0 = None if h0 is None else jax.tree.map(torch.from_numpy, h0)
    t_out, t_h = ref(t_packed, t_h0)
    _loss(t_out, t_h).backward()

    j_packed = jrnn.pack_padded_sequence(jnp.asarray(x), lengths, bf, enforce_sorted)
    j_out, j_h = ours(j_packed, h0)
    _same_layout(j_out, t_out)
    _close(j_out.data, t_out.data)
    for g, w in zip(jax.tree.leaves(j_h), torch.utils._pytree.tree_leaves(t_h), strict=True):
        _close(g, w)  # the shorter sequences' states too, in the original batch order
    # Parameter gradients (jm.backward) and the input's (jax.grad through the packing).
    jm.backward(lambda: _loss(*ours(jrnn.pack_padded_sequence(x, lengths, bf, enforce_sorted),
                                    h0)))  # fmt: skip
    for (n, p), (tn, tp) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        assert n == tn
        _close(p.grad, tp.grad, rtol=1e-4, atol=1e-5)

    def by_input(x):
        return _loss(*ours(jrnn.pack_padded_sequence(x, lengths, bf, enforce_sorted), h0))

    _close(jax.grad(by_input)(jnp.asarray(x)), tx.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.torch
@pytest.mark.parametrize("case", ["GRU-batch_first-h0", "LSTM-proj-2layers-bidirectional-h0"])
def test_packed_rnn_compiled_matches_torch(case):
    name, kwargs, _ = RNN_CASES[case]
    ref, ours = _pair(name, kwargs, seed=2)
    seqs = _seqs(LENGTHS, trailing=(IN,), seed=3)
    t_out, t_h = ref(trnn.pack_sequence([torch.from_numpy(s) for s in seqs], False))
    want = trnn.pad_packed_sequence(t_out, batch_first=True, total_length=6)[0]

    # The PackedSequence itself crosses the compiled boundary (data traced, layout static).
    @jm.compile
    def forward(model, packed):
        out, h = model(packed)
        return out, h, jrnn.pad_packed_sequence(out, batch_first=True, total_length=6)[0]

    packed = jrnn.pack_sequence([jnp.asarray(s) for s in seqs], False)
    out, h, padded = forward(ours, packed)
    _same_layout(out, t_out)
    _close(out.data, t_out.data)
    _close(padded, want)
    for g, w in zip(jax.tree.leaves(h), torch.utils._pytree.tree_leaves(t_h), strict=True):
        _close(g, w)
    # model.compile() takes it too.
    ours.compile()
    _close(ours(packed)[0].data, t_out.data)


@pytest.mark.torch
def test_compiled_forward_retraces_for_a_new_layout_of_the_same_shape():
    # [3, 1] and [2, 2] both pack 4 rows: only the static layout tells them apart.
    ref, ours = _pair("GRU", {}, seed=5)
    step = jm.compile(lambda model, packed: model(packed))
    x = _padded([3, 3], seed=6)
    for lengths in ([3, 1], [2, 2], [3, 1]):
        t_out, t_h = ref(trnn.pack_padded_sequence(torch.from_numpy(x), lengths))
        out, h = step(ours, jrnn.pack_padded_sequence(jnp.asarray(x), lengths))
        _close(out.data, t_out.data)
        _close(h, t_h)
    assert jm.compile_stats(step).num_traces == 2


@pytest.mark.torch
def test_packed_dropout_between_layers_compiled_equals_eager():
    ref, model = _pair("LSTM", {"num_layers": 2, "dropout": 0.5})
    packed = jrnn.pack_padded_sequence(jnp.asarray(_padded(LENGTHS)), LENGTHS, False, False)
    jm.manual_seed(3)
    first = model(packed)[0].data
    assert not np.allclose(first, model(packed)[0].data)  # a fresh mask per call
    compiled = jm.compile(lambda m, p: m(p)[0].data)
    jm.manual_seed(3)
    _close(compiled(model, packed), first)
    model.eval(), ref.eval()
    t_packed = trnn.pack_padded_sequence(torch.from_numpy(_padded(LENGTHS)), LENGTHS, False, False)
    _close(model(packed)[0].data, ref(t_packed)[0].data)


@pytest.mark.torch
def test_packed_rnn_input_errors():
    packed = jrnn.pack_sequence([jnp.ones((3, IN)), jnp.ones((1, IN))])
    t_packed = trnn.pack_sequence([torch.ones(3, IN), torch.ones(1, IN)])
    # (torch's LSTM skips this check for packed input and fails in its matmul instead.)
    with pytest.raises(RuntimeError) as want:
        torch.nn.RNN(IN, H)(t_packed._replace(data=torch.ones(4, IN, 1)))
    for model in (jm.nn.RNN(IN, H), jm.nn.LSTM(IN, H)):
        with pytest.raises(RuntimeError) as got:
            model(packed._replace(data=jnp.ones((4, IN, 1))))
        assert str(got.value) == str(want.value)
    gru = jm.nn.GRU(IN, H)
    with pytest.raises(RuntimeError) as want:
        torch.nn.GRU(IN, H)(t_packed, torch.zeros(1, 3, H))
    with pytest.raises(RuntimeError) as got:
        gru(packed, jnp.zeros((1, 3, H)))
    assert str(got.value) == str(want.value)


# ---------------------------------------------------------------------------- training


def _train_pair(dtype):
    torch.manual_seed(4)
    ref = torch.nn.LSTM(IN, H, num_layers=2, bidirectional=True, batch_first=True).to(dtype)
    head_ref = torch.nn.Linear(2 * H, 1).to(dtype)
    ours = jm.nn.LSTM(IN, H, num_layers=2, bidirectional=True, batch_first=True)
    head = jm.nn.Linear(2 * H, 1)
    if dtype == torch.float64:
        ours, head = ours.double(), head.double()
    ours.load_state_dict(ref.state_dict())
    head.load_state_dict(head_ref.state_dict())
    return (ref, head_ref), jm.nn.ModuleDict({"lstm": ours, "head": head})


# Two layouts, alternating (as length buckets do): a compiled step traces once per layout.
LAYOUTS = ([5, 2, 4, 1], [3, 3, 5, 2])


def _batches(steps, np_dtype):
    rng = np.random.default_rng(5)
    out = []
    for i in range(steps):
        lengths = LAYOUTS[i % 2]
        x = rng.standard_normal((4, 5, IN)).astype(np_dtype)
        y = rng.standard_normal((4, 5, 1)).astype(np_dtype)
        out.append((x, y, lengths))
    return out


def _torch_step(ref, opt, x, y, lengths):
    lstm, head = ref
    opt.zero_grad()
    packed = trnn.pack_padded_sequence(torch.from_numpy(x), lengths, True, False)
    out, (h, _) = lstm(packed)
    padded, _ = trnn.pad_packed_sequence(out, batch_first=True, total_length=5)
    loss = ((head(padded) - torch.from_numpy(y)) ** 2).mean() + (h**2).mean()
    loss.backward()
    opt.step()
    return loss.item()


def _jm_step(model, opt, x, y, lengths):
    opt.zero_grad()

    def closure():
        packed = jrnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, (h, _) = model["lstm"](packed)
        padded, _ = jrnn.pad_packed_sequence(out, batch_first=True, total_length=5)
        return ((model["head"](padded) - y) ** 2).mean() + (h**2).mean()

    loss = jm.backward(closure)
    opt.step()
    return loss


@pytest.mark.torch
def test_compiled_training_step_one_step_float32_matches_torch():
    ref, model = _train_pair(torch.float32)
    t_opt = torch.optim.SGD([*ref[0].parameters(), *ref[1].parameters()], lr=0.5)
    opt = jm.optim.SGD(model.parameters(), lr=0.5)
    step = jm.compile(_jm_step)
    ((x, y, lengths),) = _batches(1, np.float32)
    want = _torch_step(ref, t_opt, x, y, lengths)
    got = step(model, opt, jnp.asarray(x), jnp.asarray(y), lengths)
    assert abs(float(got) - want) < 1e-5 * max(1.0, abs(want))
    named = [*ref[0].named_parameters("lstm"), *ref[1].named_parameters("head")]
    for (n, p), (tn, tp) in zip(model.named_parameters(), named, strict=True):
        assert n == tn
        _close(p, tp, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("compiled", [True, False])
def test_ten_training_steps_float64_match_torch(compiled):
    with jax.enable_x64(True):
        ref, model = _train_pair(torch.float64)
        # lr exact in float32 (jm.optim keeps hyper-parameters as float32).
        t_opt = torch.optim.SGD([*ref[0].parameters(), *ref[1].parameters()], lr=0.25, momentum=0.5)
        opt = jm.optim.SGD(model.parameters(), lr=0.25, momentum=0.5)
        step = jm.compile(_jm_step) if compiled else _jm_step
        for x, y, lengths in _batches(10, np.float64):
            want = _torch_step(ref, t_opt, x, y, lengths)
            got = step(model, opt, jnp.asarray(x), jnp.asarray(y), lengths)
            assert abs(float(got) - want) < 1e-10
        if compiled:
            assert jm.compile_stats(step).num_traces == len(LAYOUTS)
        named = [*ref[0].named_parameters("lstm"), *ref[1].named_parameters("head")]
        for (n, p), (tn, tp) in zip(model.named_parameters(), named, strict=True):
            assert n == tn
            np.testing.assert_allclose(np.asarray(p), tp.detach().numpy(), rtol=0, atol=1e-10)
