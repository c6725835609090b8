"""``nn.Parameter``'s ``new_*``, ``to`` and dtype conversions, and the dtype aliases
``jm.float``, ``jm.int``, ``jm.short``, ``jm.cfloat``, ``jm.cdouble`` (issue 27), against
torch live.

torch returns the parameter itself when a conversion changes nothing, else a new
tensor (not a Parameter); here a new ``jax.Array``, through which gradients flow.
"""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch

import jmodule as jm
from jmodule import nn

VALUES = (np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5) / 2


def _pair(dtype="float32", values=VALUES):
    a = values.astype(dtype)
    grad = a.dtype.kind in "fc"
    return (
        torch.nn.Parameter(torch.from_numpy(a.copy()), requires_grad=grad),
        nn.Parameter(jnp.asarray(a), requires_grad=grad),
    )


def _name(dtype):
    return str(dtype).removeprefix("torch.")


def _outcome(out, given):
    """What a call returned, comparably: kind (the parameter itself, or a new array),
    values, dtype, shape."""
    if isinstance(out, torch.Tensor):
        kind = "self" if out is given else type(out).__name__.replace("Tensor", "array")
        return kind, out.detach().numpy().tolist(), _name(out.dtype), tuple(out.shape)
    new = isinstance(out, jax.Array) or type(out) is jm.Tensor  # (new_* give jm.Tensors)
    kind = "self" if out is given else ("array" if new else type(out))
    a = np.asarray(out)
    return kind, a.tolist(), str(a.dtype), a.shape


def _narrow(name):
    """Section 2's x64 rule: torch's 64-bit integers are 32-bit here while x64 is off."""
    return {"int64": "int32"}.get(name, name)


def _same(t_out, t_given, j_out, j_given):
    kind, values, dtype, shape = _outcome(t_out, t_given)
    want = (kind, values, _narrow(dtype), shape)
    assert _outcome(j_out, j_given) == want


DTYPE_PAIRS = [
    (torch.float32, jm.float32),
    (torch.float16, jm.float16),
    (torch.bfloat16, jm.bfloat16),
    (torch.int32, jm.int32),
    (torch.int64, jm.int64),
    (torch.int16, jm.int16),
    (torch.bool, jm.bool),
]


def _comparable(t):
    # bfloat16 has no numpy dtype in torch: compare its values as float32
    return t.float() if t.dtype == torch.bfloat16 else t


@pytest.mark.torch
@pytest.mark.parametrize("src", ["float32", "float16"])
@pytest.mark.parametrize("pair", DTYPE_PAIRS, ids=lambda p: _name(p[0]))
def test_to_dtype_as_torch(src, pair):
    tp, jp = _pair(src)
    t_dtype, j_dtype = pair
    t_out, j_out = tp.to(t_dtype), jp.to(j_dtype)
    assert (t_out is tp) == (j_out is jp)
    assert _narrow(_name(t_out.dtype)) == str(j_out.dtype)
    np.testing.assert_array_equal(
        np.asarray(j_out, dtype=np.float32), _comparable(t_out).detach().numpy().astype(np.float32)
    )


METHODS = ["float", "half", "bfloat16", "int", "long", "short", "char", "byte", "bool"]


@pytest.mark.torch
@pytest.mark.parametrize("src", ["float32", "float16", "int32"])
@pytest.mark.parametrize("method", METHODS)
def test_conversion_methods_as_torch(src, method):
    # unsigned and 8-bit targets: values they hold (torch wraps others, C leaves them undefined)
    tp, jp = _pair(src, VALUES + 2.5 if method in ("byte", "char") else VALUES)
    t_out, j_out = getattr(tp, method)(), getattr(jp, method)()
    assert (t_out is tp) == (j_out is jp)
    assert type(t_out) is (torch.nn.Parameter if t_out is tp else torch.Tensor)
    if j_out is jp:
        assert isinstance(j_out, nn.Parameter)
    else:  # torch's result has a grad_fn when differentiable: jmodule's is on the graph
        assert t_out.requires_grad == (type(j_out) is jm.Tensor and j_out.requires_grad)
        assert isinstance(j_out if type(j_out) is not jm.Tensor else j_out.array, jax.Array)
    assert _narrow(_name(t_out.dtype)) == str(j_out.dtype)
    np.testing.assert_array_equal(
        np.asarray(j_out, dtype=np.float32), _comparable(t_out).detach().numpy().astype(np.float32)
    )


@pytest.mark.torch
def test_double_needs_x64_and_says_so():
    _, jp = _pair()
    with pytest.raises(jm.DtypeError, match="jax_enable_x64"):
        jp.double()
    with pytest.raises(jm.DtypeError, match="jax_enable_x64"):
        jp.to(jm.float64)


@pytest.mark.torch
def test_to_device_other_and_copy_as_torch():
    tp, jp = _pair()
    _same(tp.to("cpu"), tp, jp.to("cpu"), jp)
    _same(tp.to(device="cpu"), tp, jp.to(device="cpu"), jp)
    _same(tp.to("cpu", torch.float16), tp, jp.to("cpu", jm.float16), jp)
    _same(tp.to(device="cpu", dtype=torch.float16), tp, jp.to(device="cpu", dtype=jm.float16), jp)
    assert jp.to(jax.devices()[0]) is jp
    # to(other): its dtype (and device)
    t_other, j_other = torch.zeros(2, dtype=torch.int32), jnp.zeros(2, jnp.int32)
    _same(tp.to(t_other), tp, jp.to(j_other), jp)
    _same(tp.to(tp), tp, jp.to(jp), jp)
    # copy=True: a new tensor even when nothing changes (keyword or positional)
    _same(tp.to(torch.float32, copy=True), tp, jp.to(jm.float32, copy=True), jp)
    _same(tp.to(torch.float32, False, True), tp, jp.to(jm.float32, False, True), jp)
    _same(tp.to(torch.float32, non_blocking=True), tp, jp.to(jm.float32, non_blocking=True), jp)
    out = jp.to(memory_format=jm.preserve_format)
    assert out is tp.to(memory_format=torch.preserve_format) is tp or out is jp
    with pytest.raises(TypeError, match="unexpected keyword"):
        jp.to(jm.float32, layout=None)


@pytest.mark.torch
def test_to_a_device_jax_cannot_see_raises():
    _, jp = _pair()
    with pytest.raises(jm.DeviceError):
        jp.to("cuda:7")


@pytest.mark.torch
def test_complex_to_real_warns_as_torch():
    a = (VALUES + 1j * VALUES).astype(np.complex64)
    tp = torch.nn.Parameter(torch.from_numpy(a.copy()))
    jp = nn.Parameter(jnp.asarray(a))
    with warnings.catch_warnings(record=True) as t_caught:
        warnings.simplefilter("always")
        t_out = tp.float()
    with warnings.catch_warnings(record=True) as j_caught:
        warnings.simplefilter("always")
        j_out = jp.float()
    assert [w.category for w in j_caught] == [w.category for w in t_caught]
    assert str(t_caught[0].message).startswith(str(j_caught[0].message))
    np.testing.assert_array_equal(np.asarray(j_out), t_out.detach().numpy())


def _new_calls():
    # (label, torch call, jm call): each on the parameter, with torch's / jm's dtypes
    return [
        ("new_zeros(2, 3)", lambda p: p.new_zeros(2, 3), lambda p: p.new_zeros(2, 3)),
        ("new_zeros((2, 3))", lambda p: p.new_zeros((2, 3)), lambda p: p.new_zeros((2, 3))),
        ("new_zeros([4])", lambda p: p.new_zeros([4]), lambda p: p.new_zeros([4])),
        ("new_zeros(())", lambda p: p.new_zeros(()), lambda p: p.new_zeros(())),
        (
            "new_zeros(size=)",
            lambda p: p.new_zeros(size=(1, 2)),
            lambda p: p.new_zeros(size=(1, 2)),
        ),
        (
            "new_zeros(dtype=int64)",
            lambda p: p.new_zeros(2, dtype=torch.int64),
            lambda p: p.new_zeros(2, dtype=jm.long),
        ),
        (
            "new_zeros(device=)",
            lambda p: p.new_zeros(2, device="cpu"),
            lambda p: p.new_zeros(2, device="cpu"),
        ),
        ("new_ones(3, 1)", lambda p: p.new_ones(3, 1), lambda p: p.new_ones(3, 1)),
        (
            "new_ones(dtype=bool)",
            lambda p: p.new_ones((2,), dtype=torch.bool),
            lambda p: p.new_ones((2,), dtype=jm.bool),
        ),
        ("new_empty(2)", lambda p: p.new_empty(2), lambda p: p.new_empty(2)),
        ("new_full((2,), 3)", lambda p: p.new_full((2,), 3), lambda p: p.new_full((2,), 3)),
        (
            "new_full(2.5, int64)",
            lambda p: p.new_full((2, 2), 2.5, dtype=torch.int64),
            lambda p: p.new_full((2, 2), 2.5, dtype=jm.long),
        ),
        (
            "new_full(size=, fill_value=)",
            lambda p: p.new_full(size=(3,), fill_value=-1.5),
            lambda p: p.new_full(size=(3,), fill_value=-1.5),
        ),
        ("new_tensor(ints)", lambda p: p.new_tensor([1, 2]), lambda p: p.new_tensor([1, 2])),
        (
            "new_tensor(nested floats)",
            lambda p: p.new_tensor([[0.5], [1.5]]),
            lambda p: p.new_tensor([[0.5], [1.5]]),
        ),
        (
            "new_tensor(dtype=int32)",
            lambda p: p.new_tensor([1.7, -2.2], dtype=torch.int32),
            lambda p: p.new_tensor([1.7, -2.2], dtype=jm.int),
        ),
    ]


@pytest.mark.torch
@pytest.mark.parametrize("src", ["float32", "float16", "int32"])
@pytest.mark.parametrize("call", _new_calls(), ids=lambda c: c[0])
def test_new_methods_as_torch(src, call):
    label, t_call, j_call = call
    tp, jp = _pair(src)
    t_out, j_out = t_call(tp), j_call(jp)
    assert type(t_out) is torch.Tensor and not t_out.requires_grad
    assert type(j_out) is jm.Tensor  # a new tensor, as torch's (with torch's methods)
    if label.startswith("new_empty"):  # torch's values are uninitialised; here zeros
        t_out = torch.zeros_like(t_out)
    _same(t_out, tp, j_out, jp)


@pytest.mark.torch
def test_new_tensor_copies_an_array_into_the_parameters_dtype():
    tp, jp = _pair()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch recommends clone() for tensor data
        t_out = tp.new_tensor(torch.tensor([1, 2], dtype=torch.int32))
    _same(t_out, tp, jp.new_tensor(jnp.asarray([1, 2], jnp.int32)), jp)


@pytest.mark.torch
def test_new_methods_refuse_what_torch_refuses():
    tp, jp = _pair()
    with pytest.raises(TypeError):
        tp.new_zeros(2.0)
    with pytest.raises(TypeError, match="size must be an int"):
        jp.new_zeros(2.0)
    # requires_grad=True: torch gives a leaf that requires grad; jmodule differentiates
    # parameters, so it says to make one
    assert tp.new_zeros(2, requires_grad=True).requires_grad
    with pytest.raises(ValueError, match=r"jm\.nn\.Parameter"):
        jp.new_zeros(2, requires_grad=True)
    with pytest.raises(TypeError, match="unexpected keyword"):
        jp.new_ones(2, colour="red")


def test_new_arrays_are_on_the_parameters_device():
    device = jax.devices()[0]
    jp = nn.Parameter(jax.device_put(jnp.ones((2, 3)), device))
    for out in (jp.new_zeros(2), jp.new_ones(2), jp.new_full((2,), 1.0), jp.new_tensor([1.0])):
        assert out.devices() == {device}


@pytest.mark.slow
@pytest.mark.torch
def test_new_zeros_in_init_hidden_eager_and_compiled():
    """word_language_model's ``init_hidden``: ``weight.new_zeros(nlayers, bsz, nhid)``."""

    def make(nn_):
        class RNNModel(nn_.Module):
            def __init__(self):
                super().__init__()
                self.encoder = nn_.Embedding(10, 4)
                self.rnn = nn_.LSTM(4, 5, 2)
                self.decoder = nn_.Linear(5, 10)

            def forward(self, input, hidden):
                output, hidden = self.rnn(self.encoder(input), hidden)
                return self.decoder(output), hidden

            def init_hidden(self, bsz):
                weight = next(self.parameters())
                return (weight.new_zeros(2, bsz, 5), weight.new_zeros((2, bsz, 5)))

        return RNNModel()

    torch.manual_seed(0)
    tm = make(torch.nn)
    jm_model = make(nn)
    jm_model.load_state_dict({k: v.detach().numpy() for k, v in tm.state_dict().items()})
    tokens = np.arange(6).reshape(3, 2) % 10
    t_out, _ = tm(torch.from_numpy(tokens), tm.init_hidden(2))
    j_out, _ = jm_model(jnp.asarray(tokens), jm_model.init_hidden(2))
    np.testing.assert_allclose(np.asarray(j_out), t_out.detach().numpy(), rtol=1e-5, atol=1e-6)

    @jm.compile
    def run(model, tokens):
        out, _ = model(tokens, model.init_hidden(tokens.shape[1]))
        return out

    np.testing.assert_allclose(
        np.asarray(run(jm_model, jnp.asarray(tokens))), t_out.detach().numpy(), rtol=1e-5, atol=1e-6
    )
    jm_model.compile()
    j_out, _ = jm_model(jnp.asarray(tokens), jm_model.init_hidden(2))
    np.testing.assert_allclose(np.asarray(j_out), t_out.detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.torch
def test_gradients_flow_through_conversions_as_torch():
    def loss(p, lib):
        as_float = (lambda t: t.float()) if lib == "torch" else (lambda a: a.astype(jm.float))
        bf16 = torch.bfloat16 if lib == "torch" else jm.bfloat16
        return (
            (as_float(p.half()) * 3).sum()
            + (as_float(p.to(bf16)) ** 2).sum()
            + (p.float() * p).sum()
            + p.new_zeros(3).sum()
        )

    tp, jp = _pair()
    loss(tp, "torch").backward()

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = jp

    holder = Holder()
    jm.backward(lambda: loss(holder.p, "jm"))
    np.testing.assert_allclose(np.asarray(jp.grad), tp.grad.numpy(), rtol=1e-2)

    @jm.compile
    def step(m):
        m.p.grad = None
        jm.backward(lambda: loss(m.p, "jm"))

    step(holder)
    np.testing.assert_allclose(np.asarray(holder.p.grad), tp.grad.numpy(), rtol=1e-2)


@pytest.mark.torch
def test_conversions_inside_compiled_code():
    _, jp = _pair()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = jp

        def forward(self, x):
            return x @ self.w.to(jm.bfloat16).astype(jm.float).T + self.w.new_ones(2)

    m = M()
    eager = m(jnp.ones((1, 3)))
    m.compile()
    np.testing.assert_array_equal(np.asarray(m(jnp.ones((1, 3)))), np.asarray(eager))


def test_meta_parameters_convert_to_meta():
    with jm.device("meta"):
        layer = nn.Linear(3, 2)
    out = layer.weight.to(jm.float16)
    assert isinstance(out, jax.ShapeDtypeStruct) and out.dtype == jnp.float16
    assert layer.weight.float() is layer.weight
    zeros = layer.weight.new_zeros(4)
    assert isinstance(zeros, jax.ShapeDtypeStruct) and zeros.shape == (4,)


# ------------------------------------------------------------------ dtype aliases


@pytest.mark.torch
@pytest.mark.parametrize("name", ["float", "int", "short", "cfloat", "cdouble", "long", "double"])
def test_dtype_aliases_name_torchs_dtypes(name):
    want = getattr(torch, name)
    assert jnp.dtype(getattr(jm, name)).name == _name(want)


def test_builtin_named_aliases_leave_the_builtins_alone():
    import jmodule

    assert "float" in dir(jm) and "int" in dir(jm)
    assert "float" not in vars(jmodule) and "int" not in vars(jmodule)
    assert float("1.5") == 1.5 and int("3") == 3


@pytest.mark.torch
def test_dtype_aliases_in_use():
    assert jm.zeros(2, dtype=jm.float).dtype == jnp.float32
    assert jnp.ones(2).astype(jm.int).dtype == jnp.int32
    assert jm.arange(3, dtype=jm.long).dtype == jnp.dtype(_narrow("int64"))
    assert jm.ones(2, dtype=jm.short).dtype == torch.ones(2, dtype=torch.short).numpy().dtype
    assert jm.zeros(2, dtype=jm.cfloat).dtype == jnp.complex64
    p = nn.Parameter(jnp.ones(2, jnp.float16))
    assert p.to(jm.float).dtype == jnp.float32
