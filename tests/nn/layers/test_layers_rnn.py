"""RNN, LSTM, GRU and their cells against PyTorch live (tests/layer_harness.py), plus
dropout between layers, PyTorch's construction checks and the shape errors."""

import copy
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from layer_harness import ALL_CHECKS, LayerCase, parametrize

import jmodule as jm

T, N, IN, H = 5, 2, 3, 4


def _x(*shape, seed=None):
    if seed is not None:
        return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


def _with(*shapes):
    return lambda rng: tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


NO_INIT = tuple(k for k in ALL_CHECKS if k != "init")

# Options are spread over few cases: each case compiles its recurrence several
# times (eager, gradients, compiled, two low-precision dtypes).
CASES = [
    LayerCase("RNN", (IN, H),
              {"nonlinearity": "relu", "num_layers": 2, "bidirectional": True,
               "batch_first": True},
              inputs=_x(N, T, IN), checks=NO_INIT),
    LayerCase("RNN", (IN, H, 1, "tanh", False), inputs=_with((T, IN), (1, H)),
              id="RNN(bias=False)-unbatched-h0", checks=NO_INIT),
    # Dropout between the layers draws random masks: outputs are compared in
    # eval mode; test_rnn_dropout_between_layers covers training mode.
    LayerCase("LSTM", (IN, H), {"num_layers": 2, "dropout": 0.3, "batch_first": True},
              inputs=_x(N, T, IN), random=True, checks=NO_INIT),
    LayerCase("LSTM", (IN, H), {"proj_size": 2, "bidirectional": True, "bias": False},
              inputs=_x(T, N, IN),
              call_kwargs={"hx": (_x(2, N, 2, seed=1), _x(2, N, H, seed=2))},
              id="LSTM(proj_size=2, bidirectional, bias=False)-h0-c0", checks=NO_INIT),
    LayerCase("LSTM", (IN, H), inputs=_x(T, IN),
              call_kwargs={"hx": (_x(1, H, seed=3), _x(1, H, seed=4))},
              id="LSTM-unbatched-h0-c0", checks=NO_INIT),
    LayerCase("GRU", (IN, H), {"bidirectional": True}, inputs=_with((T, N, IN), (2, N, H)),
              id="GRU(bidirectional)-h0", checks=NO_INIT),
    LayerCase("RNNCell", (IN, H), inputs=_with((N, IN), (N, H)), checks=NO_INIT),
    LayerCase("LSTMCell", (IN, H), {"bias": False}, inputs=_x(IN),
              call_kwargs={"hx": (_x(H, seed=5), _x(H, seed=6))},
              id="LSTMCell(bias=False)-unbatched-hx", checks=NO_INIT),
    LayerCase("GRUCell", (IN, H), inputs=_x(N, IN), checks=NO_INIT),
    # Initialisation statistics need more than a handful of numbers per parameter.
    # (One size for all, so they share parameter shapes and compiled draws.)
    LayerCase("RNN", (16, 32), {"bidirectional": True}, checks=("init",)),
    LayerCase("LSTM", (16, 32), {"num_layers": 2, "proj_size": 8}, checks=("init",)),
    LayerCase("GRU", (16, 32), checks=("init",)),
    LayerCase("RNNCell", (16, 32), {"nonlinearity": "relu"}, checks=("init",)),
    LayerCase("LSTMCell", (16, 32), checks=("init",)),
    LayerCase("GRUCell", (16, 32), checks=("init",)),
]  # fmt: skip

VALUES, IDS = parametrize(CASES)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("check", "case"), VALUES, ids=IDS)
def test_rnn_matches_pytorch(check, case):
    ALL_CHECKS[check](case)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["rnn_tanh_cell", "rnn_relu_cell", "lstm_cell", "gru_cell"])
def test_functional_cells_match_torch(name):
    rng = np.random.default_rng(7)
    gates = {"lstm_cell": 4, "gru_cell": 3}.get(name, 1)
    x, h, c = (rng.standard_normal(s).astype(np.float32) for s in ((N, IN), (N, H), (N, H)))
    w_ih, w_hh = (rng.standard_normal((gates * H, n)).astype(np.float32) for n in (IN, H))
    b_ih, b_hh = (rng.standard_normal(gates * H).astype(np.float32) for _ in range(2))
    hx = (h, c) if name == "lstm_cell" else h
    want = getattr(torch, name)(
        *[torch.from_numpy(a) if isinstance(a, np.ndarray) else tuple(map(torch.from_numpy, a))
          for a in (x, hx, w_ih, w_hh, b_ih, b_hh)]
    )  # fmt: skip
    got = getattr(jm.nn.functional, name)(x, hx, w_ih, w_hh, b_ih, b_hh)
    for g, w in zip(jax.tree.leaves(got), torch.utils._pytree.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_rnn_parameter_groups_and_flatten_parameters_like_torch():
    ref = torch.nn.LSTM(IN, H, num_layers=2, bidirectional=True, proj_size=2)
    ours = jm.nn.LSTM(IN, H, num_layers=2, bidirectional=True, proj_size=2)
    assert ours._flat_weights_names == ref._flat_weights_names
    assert [[p.shape for p in g] for g in ours.all_weights] == [
        [tuple(p.shape) for p in g] for g in ref.all_weights
    ]
    ours.flatten_parameters()  # a no-op, kept for code that calls it
    assert ours.mode == ref.mode == "LSTM"


def test_rnn_dropout_between_layers():
    x = jnp.asarray(_x(T, N, IN, seed=5))
    model = jm.nn.GRU(IN, H, num_layers=2, dropout=0.5)
    jm.manual_seed(1)
    first, _ = model(x)
    second, _ = model(x)
    assert not np.allclose(first, second)  # a fresh mask per call
    compiled = copy.deepcopy(model)
    compiled.compile()
    jm.manual_seed(1)
    np.testing.assert_allclose(np.asarray(compiled(x)[0]), np.asarray(first), rtol=1e-5, atol=1e-6)
    # Under jax.grad the key comes in explicitly, as for any random layer.
    params = dict(model.named_parameters())

    def loss(p):
        out = jm.func.functional_call(model, p, (x,), rng_key=jax.random.PRNGKey(0))[0]
        return out.sum()

    grads = jax.grad(loss)(params)
    assert set(grads) == set(params)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads.values())


@pytest.mark.torch
def test_rnn_long_sequence_bfloat16_stays_close():
    # The hidden state is carried in float32, so 64 bfloat16 steps stay near float32.
    ref = torch.nn.LSTM(IN, H)
    ours = jm.nn.LSTM(IN, H)
    ours.load_state_dict(ref.state_dict())
    x = _x(64, N, IN, seed=6)
    with torch.no_grad():
        want = ref(torch.from_numpy(x))[0].numpy()
    ours.to(jnp.bfloat16)
    got = ours(jnp.asarray(x, jnp.bfloat16))[0]
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=0.03)


def _torch_raises(fn):
    with pytest.raises(Exception) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn()
    return info.value


CONSTRUCTION_ERRORS = [
    ("LSTM", (IN, H), {"proj_size": H}),
    ("LSTM", (IN, H), {"proj_size": -1}),
    ("GRU", (IN, H), {"proj_size": 2}),
    ("RNN", (IN, H), {"nonlinearity": "gelu"}),
    ("RNN", (IN, H), {"dropout": 1.5}),
    ("LSTM", (IN, 0), {}),
    ("LSTM", (IN, H), {"num_layers": 0}),
    ("GRU", (IN, H), {"bias": 1}),
]


@pytest.mark.torch
@pytest.mark.parametrize(("name", "args", "kwargs"), CONSTRUCTION_ERRORS)
def test_construction_errors_match_torch(name, args, kwargs):
    expected = _torch_raises(lambda: getattr(torch.nn, name)(*args, **kwargs))
    with pytest.raises(type(expected)) as info:
        getattr(jm.nn, name)(*args, **kwargs)
    assert str(info.value) == str(expected)


@pytest.mark.torch
def test_dropout_with_one_layer_warns_like_torch():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.nn.LSTM(IN, H, dropout=0.2)
    with pytest.warns(UserWarning) as ours:
        jm.nn.LSTM(IN, H, dropout=0.2)
    assert str(ours[0].message) == str(caught[0].message)
    assert ours[0].filename == __file__  # points at the caller, as PyTorch's does


FORWARD_ERRORS = [
    (jm.nn.LSTM(IN, H), (np.zeros((T, IN + 1), np.float32),),
     r"input.size\(-1\) must be equal to input_size. Expected 3, got 4"),
    (jm.nn.GRU(IN, H), (np.zeros((1, T, N, IN), np.float32),),
     r"GRU: Expected input to be 2D or 3D, got 4D"),
    (jm.nn.RNN(IN, H), (np.zeros((T, N, IN), np.float32), np.zeros((1, 3, H), np.float32)),
     r"Expected hidden size \(1, 2, 4\), got \[1, 3, 4\]"),
    (jm.nn.RNN(IN, H), (np.zeros((T, N, IN), np.float32), np.zeros((N, H), np.float32)),
     r"For batched 3-D input, hx should also be 3-D but got 2-D"),
    (jm.nn.LSTM(IN, H, proj_size=2),
     (np.zeros((T, N, IN), np.float32), (np.zeros((1, N, H)), np.zeros((1, N, H)))),
     r"Expected hidden\[0\] size \(1, 2, 2\), got \[1, 2, 4\]"),
    (jm.nn.LSTM(IN, H), (np.zeros((T, N, IN), np.float16),),
     r"input dtype \(float16\) does not match weight dtype \(float32\)"),
    (jm.nn.LSTM(IN, H), ((np.zeros((T, IN)), [T]),), r"expects an array or a PackedSequence"),
    (jm.nn.LSTMCell(IN, H), (np.zeros((1, N, IN), np.float32),),
     r"LSTMCell: Expected input to be 1D or 2D, got 3D"),
    (jm.nn.GRUCell(IN, H), (np.zeros((N, IN), np.float32), np.zeros((N + 1, H), np.float32)),
     r"GRUCell: Expected hidden of shape \(2, 4\)"),
    (jm.nn.RNNCell(IN, H), (np.zeros((N, IN + 2), np.float32),),
     r"RNNCell: input has inconsistent input_size: got 5 expected 3"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "args", "match"), FORWARD_ERRORS, ids=[m.split(" ")[0] for *_, m in FORWARD_ERRORS]
)
def test_forward_errors_name_expected_and_given(model, args, match):
    with pytest.raises((ValueError, RuntimeError, TypeError), match=match):
        model(*args)
