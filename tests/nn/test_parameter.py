"""Parameter and Buffer against live PyTorch: array behaviour, attributes, copying.

A jmodule Parameter is not a ``jax.Array`` subclass, but it must work wherever
one does in ``jnp``/``jax.nn`` code and Python arithmetic, giving the values
torch gives for the same Parameter.
"""

import copy
import operator
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from torch_ref import JM, SIDES, TORCH, canon, dtype_name, outcome, outcomes, to_numpy

import jmodule as jm
from jmodule import nn

P = np.array([[1.5, -2.0, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
Q = np.array([[2.0, 1.0, -0.5], [3.0, -2.5, 1.0]], dtype=np.float32)
V = np.array([1.0, -1.0, 2.0], dtype=np.float32)
IP = np.array([5, 6, 12], dtype=np.int32)
IQ = np.array([3, 10, 7], dtype=np.int32)


def _operands(s):
    return {
        "p": s.param(P),
        "q": s.param(Q),
        "a": s.arr(P[::-1].copy()),
        "v": s.arr(V),
        "ip": s.nn.Parameter(s.arr(IP, dtype="int64"), requires_grad=False),
        "iq": s.nn.Parameter(s.arr(IQ, dtype="int64"), requires_grad=False),
    }


OPERATORS = {
    "p + q": lambda o: o["p"] + o["q"],
    "p + a": lambda o: o["p"] + o["a"],
    "a + p": lambda o: o["a"] + o["p"],
    "p - 2": lambda o: o["p"] - 2,
    "2 - p": lambda o: 2 - o["p"],
    "a - p": lambda o: o["a"] - o["p"],
    "p * a": lambda o: o["p"] * o["a"],
    "3 * p": lambda o: 3 * o["p"],
    "p / 2": lambda o: o["p"] / 2,
    "2 / p": lambda o: 2 / o["p"],
    "a / p": lambda o: o["a"] / o["p"],
    "p // 2": lambda o: o["p"] // 2,
    "7 // p": lambda o: 7 // o["p"],
    "p % 2": lambda o: o["p"] % 2,
    "7 % p": lambda o: 7 % o["p"],
    "p ** 2": lambda o: o["p"] ** 2,
    "2 ** p": lambda o: 2 ** o["p"],
    "p @ v": lambda o: o["p"] @ o["v"],
    "p @ q.T": lambda o: o["p"] @ o["q"].T,
    "v @ p.T": lambda o: o["v"] @ o["p"].T,
    "-p": lambda o: -o["p"],
    "+p + 0": lambda o: +o["p"] + 0,  # torch returns the Parameter itself for +p
    "abs(p)": lambda o: abs(o["p"]),
    "p < q": lambda o: o["p"] < o["q"],
    "p <= a": lambda o: o["p"] <= o["a"],
    "p > 1": lambda o: o["p"] > 1,
    "1 > p": lambda o: 1 > o["p"],
    "1 <= p": lambda o: 1 <= o["p"],
    "a < p": lambda o: o["a"] < o["p"],
    "p >= q": lambda o: o["p"] >= o["q"],
    "p == q": lambda o: o["p"] == o["q"],
    "p == p": lambda o: o["p"] == o["p"],
    "p != a": lambda o: o["p"] != o["a"],
    "ip & 3": lambda o: o["ip"] & 3,
    "3 | ip": lambda o: 3 | o["ip"],
    "ip ^ iq": lambda o: o["ip"] ^ o["iq"],
    "~ip": lambda o: ~o["ip"],
    "ip << 1": lambda o: o["ip"] << 1,
    "1 << ip": lambda o: 1 << o["ip"],
    "ip >> 1": lambda o: o["ip"] >> 1,
    "p[0]": lambda o: o["p"][0],
    "p[:, 1]": lambda o: o["p"][:, 1],
    "p[p > 0]": lambda o: o["p"][o["p"] > 0],
    "p[ip - 5][...]": lambda o: o["p"][1:2][..., ::2],
    "p.T": lambda o: o["p"].T,
    "p.reshape": lambda o: o["p"].reshape(3, 2),
    "p.sum(0)": lambda o: o["p"].sum(0),
    "p.mean()": lambda o: o["p"].mean(),
    "p.max()": lambda o: o["p"].max(),
    "len(p)": lambda o: len(o["p"]),
    "list(v-param)": lambda o: [float(x) for x in o["p"][0]],
    "float(p[0, 0])": lambda o: float(o["p"][0, 0]),
    "int(ip[1])": lambda o: int(o["ip"][1]),
    "bool(p[0, 0])": lambda o: bool(o["p"][0, 0]),
    "list index": lambda o: [10, 20, 30][o["ip"][0] - 4],
}


@pytest.mark.torch
@pytest.mark.parametrize("expr", list(OPERATORS))
def test_operators_give_torchs_values(expr):
    def run(s):
        with torch.no_grad():
            return OPERATORS[expr](_operands(s))

    t, j = outcomes(run)
    assert t[0] == "ok", t
    assert j == t


@pytest.mark.torch
def test_operator_results_are_plain_arrays():
    o = _operands(JM)
    for expr in ("p + q", "2 - p", "p < q", "-p", "p[0]", "p @ v"):
        assert type(OPERATORS[expr](o)) is type(jnp.zeros(1)), expr


FUNCTIONS = {
    "sum": (torch.sum, jnp.sum),
    "exp": (torch.exp, jnp.exp),
    "tanh": (torch.tanh, jnp.tanh),
    "relu": (torch.relu, jax.nn.relu),
    "sigmoid": (torch.sigmoid, jax.nn.sigmoid),
    "softmax": (lambda x: torch.softmax(x, -1), lambda x: jax.nn.softmax(x, axis=-1)),
    "gelu": (torch.nn.functional.gelu, lambda x: jax.nn.gelu(x, approximate=False)),
    "matmul": (lambda x: torch.matmul(x, x.T), lambda x: jnp.matmul(x, x.T)),
    "concat": (lambda x: torch.cat([x, x]), lambda x: jnp.concatenate([x, x])),
    "stack": (lambda x: torch.stack([x, x]), lambda x: jnp.stack([x, x])),
    "where": (lambda x: torch.where(x > 0, x, 0.0), lambda x: jnp.where(x > 0, x, 0.0)),
    "maximum": (lambda x: torch.maximum(x, -x), lambda x: jnp.maximum(x, -x)),
    "einsum": (lambda x: torch.einsum("ij,ij->i", x, x), lambda x: jnp.einsum("ij,ij->i", x, x)),
    "norm": (torch.linalg.norm, jnp.linalg.norm),
    "clip": (lambda x: torch.clamp(x, -1, 1), lambda x: jnp.clip(x, -1, 1)),
}


@pytest.mark.torch
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_jnp_and_jax_nn_functions_accept_parameters(name):
    torch_fn, jax_fn = FUNCTIONS[name]
    with torch.no_grad():
        expected = canon(torch_fn(TORCH.param(P)))
    assert canon(jax_fn(JM.param(P))) == expected


@pytest.mark.torch
def test_parameters_go_through_jax_transformations():
    p = JM.param(P)
    np.testing.assert_allclose(np.asarray(jax.jit(lambda w: w * 2)(p)), P * 2)
    np.testing.assert_allclose(np.asarray(jax.vmap(lambda row: row.sum())(p)), P.sum(1))
    assert jax.tree_util.tree_leaves(p)[0] is p.data
    np.testing.assert_allclose(np.asarray(p), P)
    np.testing.assert_allclose(np.asarray(jax.lax.add(p.data, p.data)), P * 2)


@pytest.mark.torch
def test_numpy_arrays_on_the_left_defer_to_the_parameter():
    p = JM.param(P)
    np.testing.assert_allclose(np.asarray(np.ones_like(P) - p), 1 - P)
    np.testing.assert_array_equal(np.asarray(np.zeros_like(P) < p), P > 0)


# ------------------------------------------------------------------ attributes


@pytest.mark.torch
def test_data_grad_requires_grad_shape_dtype_device_like_torch():
    def run(s):
        p = s.param(P)
        out = [canon(p.data), p.grad, p.requires_grad, tuple(p.shape), dtype_name(p), p.ndim]
        out.append(_device_kind(p))
        p.grad = s.arr(np.ones_like(P))
        out.append(canon(p.grad))
        keep = p
        p.data = s.arr(Q)
        out += [keep is p, canon(p), canon(p.data)]
        out.append(p.requires_grad_(False) is p)
        out.append(p.requires_grad)
        p.requires_grad_()
        out.append(p.requires_grad)
        p.requires_grad = False
        out.append((p.requires_grad, s.param(V, requires_grad=False).requires_grad))
        return out

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


def _device_kind(p):
    device = p.device
    return device.type if isinstance(device, torch.device) else device.platform


@pytest.mark.torch
def test_device_is_the_arrays_device():
    p = JM.param(P)
    assert p.device == p.data.device
    assert p.sharding == p.data.sharding


@pytest.mark.torch
def test_default_and_converted_construction_like_torch():
    def run(s):
        np_source = np.arange(4, dtype=np.float32)
        return [
            canon(s.nn.Parameter()),
            s.nn.Parameter().requires_grad,
            canon(s.nn.Parameter(s.nn.Parameter(s.arr(V)))),
            canon(s.nn.Parameter(s.arr(np_source), requires_grad=False)),
            canon(s.nn.Parameter(s.arr(V, dtype="float16"))),
        ]

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_parameter_from_numpy_torch_and_bfloat16_tensors():
    np.testing.assert_array_equal(np.asarray(nn.Parameter(P)), P)
    from_torch = nn.Parameter(torch.from_numpy(P))
    np.testing.assert_array_equal(np.asarray(from_torch), P)
    bf16 = torch.from_numpy(P).to(torch.bfloat16)
    p = nn.Parameter(bf16)
    assert p.dtype == jnp.bfloat16
    np.testing.assert_array_equal(to_numpy(p), to_numpy(bf16))


@pytest.mark.torch
def test_integer_parameters_cannot_require_grad_like_torch():
    def run(s):
        ints = s.arr(IP, dtype="int64")
        frozen = s.nn.Parameter(ints, requires_grad=False)
        return [
            outcome(lambda: s.nn.Parameter(ints)),
            outcome(lambda: s.nn.Parameter(s.arr([True, False], dtype="bool"))),
            outcome(lambda: frozen.requires_grad_()),
            outcome(lambda: setattr(frozen, "requires_grad", True)),
            frozen.requires_grad_(False).requires_grad,
            outcome(lambda: s.nn.ParameterList([ints])),
        ]

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_repr_starts_like_torchs():
    for s in SIDES:
        assert repr(s.param(V)).startswith("Parameter containing:\n")


@pytest.mark.torch
def test_parameters_hash_by_identity_like_torch():
    for s in SIDES:
        a, b = s.param(V), s.param(V)
        assert len({a, b, a}) == 2
        assert {a: 1}[a] == 1


def test_assigning_an_array_to_a_parameter_attribute_is_an_error():
    m = nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"cannot assign 'jax\.Array' as parameter 'weight'"):
        m.weight = m.weight + 1  # a new array; parameters are replaced via .data
    m.weight.data = m.weight.data + 1  # the supported update


def test_augmented_assignment_updates_the_parameter_in_place_as_torch():
    m = nn.Linear(2, 2)
    w = m.weight
    before = np.asarray(w).copy()
    with jm.no_grad():
        m.weight += 1  # torch.no_grad(): the same tensor, changed in place
    assert m.weight is w
    np.testing.assert_allclose(np.asarray(m.weight), before + 1)


# ------------------------------------------------------------------ copying


@pytest.mark.torch
@pytest.mark.parametrize(
    "copier",
    [copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))],
    ids=["deepcopy", "pickle"],
)
def test_copies_keep_value_and_requires_grad_and_drop_grad_like_torch(copier):
    def run(s):
        p = s.param(P, requires_grad=False)
        q = s.param(Q)
        q.grad = s.arr(np.ones_like(Q))
        cp, cq = copier(p), copier(q)
        return [
            (type(cp).__name__, canon(cp), cp.requires_grad, cp is not p),
            (canon(cq), cq.requires_grad, cq.grad),
        ]

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_deepcopy_memo_keeps_a_parameter_shared():
    p = JM.param(V)
    a, b = copy.deepcopy([p, p])
    assert a is b and a is not p


# ------------------------------------------------------------------ Buffer


@pytest.mark.torch
def test_buffer_marker_like_torch():
    def run(s):
        m = s.nn.Module()
        m.keep = s.nn.Buffer(s.arr(V))
        m.temp = s.nn.Buffer(s.arr([1.0]), persistent=False)
        empty = s.nn.Buffer()
        return [
            canon(m.keep),
            list(m.state_dict()),
            [k for k, _ in m.named_buffers()],
            sorted(m._non_persistent_buffers_set),
            (s.nn.Buffer(s.arr(V)).persistent, s.nn.Buffer(s.arr(V), persistent=False).persistent),
            (tuple(empty.shape), dtype_name(empty)),
        ]

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


def test_buffer_behaves_like_an_array_until_assigned():
    b = nn.Buffer(jnp.asarray(V))
    np.testing.assert_allclose(np.asarray(b * 2 + 1), V * 2 + 1)
    np.testing.assert_allclose(np.asarray(jnp.sum(b)), V.sum())
    m = nn.Module()
    m.b = b
    assert isinstance(m.b, jax.Array) and m.b is b.data


@pytest.mark.torch
def test_parameter_operators_cover_python_protocols():
    p = JM.param(P)
    ops = [operator.add, operator.sub, operator.mul, operator.truediv, operator.pow]
    for op in ops:
        np.testing.assert_allclose(np.asarray(op(p, p)), op(P, P), rtol=1e-6)
