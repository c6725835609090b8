"""``load_state_dict`` with values that cannot be loaded (issue 14, item 8).

Every bad value is reported in the one ``RuntimeError`` PyTorch raises
("Error(s) in loading state_dict for X:"), naming its key, next to the other
problems of the same call; the module is left exactly as it was. PyTorch is
the reference where it has the same case (a meta tensor); where JAX forces a
difference (no ``int64`` without ``jax_enable_x64``), a value the module cannot
hold raises instead of wrapping.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from torch_ref import JM, TORCH, outcomes, state_of

import jmodule as jm
from jmodule import nn

pytestmark = pytest.mark.torch


def _model(side=JM):
    return side.nn.Sequential(side.nn.Linear(3, 2), side.nn.BatchNorm1d(2))


def _good_state(side=JM):
    """A complete state dict for :func:`_model` whose every value differs from a new model's."""
    sd = _model(side).state_dict()
    return {
        k: side.arr(np.full(tuple(v.shape), 7), "int64" if "num_batches" in k else "float32")
        for k, v in sd.items()
    }


def _identities(m):
    return [(k, id(v)) for k, v in (*m.named_parameters(), *m.named_buffers())]


def _deleted():
    x = jnp.ones(2)
    x.delete()
    return x


def _donated():
    x = jnp.ones(2)
    jax.jit(lambda a: a + 1, donate_argnums=0)(x)
    assert x.is_deleted()
    return x


def _donated_parameter():
    p = nn.Parameter(jnp.ones(2))
    jax.jit(lambda a: a * 2, donate_argnums=0)(p.data)  # the Parameter's own array
    return p


BAD = {
    "torch meta tensor": ("0.weight", lambda: torch.empty(2, 3, device="meta"), "meta tensor"),
    # Deleted arrays: one line for all their keys, with the cause and the fix.
    "deleted jax array": ("1.bias", _deleted, "donate=False"),
    "donated jax array": ("1.bias", _donated, "donate=False"),
    "donated Parameter": ("1.weight", _donated_parameter, "donate=False"),
    "numpy strings": ("0.bias", lambda: np.array(["a", "b"]), "array of strings"),
    "numpy objects": ("0.bias", lambda: np.array([1.0, None], dtype=object), "Python objects"),
    "numpy int64 2**40": (
        "1.num_batches_tracked",
        lambda: np.array(2**40, np.int64),
        "1099511627776",
    ),
    "torch int64 2**40": ("1.num_batches_tracked", lambda: torch.tensor(2**40), "1099511627776"),
    "torch int64 -2**40": ("1.num_batches_tracked", lambda: torch.tensor(-(2**40)), "int32"),
}


@pytest.mark.parametrize("assign", [False, True])
@pytest.mark.parametrize("case", BAD)
def test_bad_value_names_its_key_in_one_runtime_error_and_changes_nothing(case, assign):
    assert not jax.config.jax_enable_x64  # int64 values become int32 here
    key, make, words = BAD[case]
    m = _model()
    before, ids = state_of(m), _identities(m)
    sd = {**_good_state(), key: make()}
    with pytest.raises(RuntimeError) as err:
        m.load_state_dict(sd, assign=assign)
    message = str(err.value)
    assert message.startswith("Error(s) in loading state_dict for Sequential:\n\t")
    if "deleted" in case or "donated" in case:
        assert isinstance(err.value, jm.DeletedArrayError)
        assert f'The checkpoint\'s arrays for "{key}" were deleted' in message
    else:
        assert f'While copying the parameter named "{key}"' in message
    assert words in message
    assert len(message.split("\n\t")) == 2  # this one problem, nothing else
    after = state_of(m)
    assert _identities(m) == ids and list(after) == list(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


def test_meta_tensor_message_is_torchs():
    def run(side):
        m = side.nn.BatchNorm1d(3)
        return m.load_state_dict({**m.state_dict(), "weight": torch.empty(3, device="meta")})

    t, j = outcomes(run)
    assert t[:2] == ("raise", "RuntimeError")
    assert j == t


def test_several_bad_keys_are_all_named_in_one_error_with_the_other_problems():
    m = _model()
    before, ids = state_of(m), _identities(m)
    sd = _good_state()
    bad_keys = []
    for case in ("torch meta tensor", "deleted jax array", "numpy strings", "torch int64 2**40"):
        key, make, _ = BAD[case]
        sd[key] = make()
        bad_keys.append(key)
    sd["1.weight"] = np.ones(5, np.float32)  # a size mismatch
    del sd["1.running_var"]  # a missing key
    sd["2.weight"] = np.ones(2, np.float32)  # an unexpected key
    with pytest.raises(RuntimeError) as err:
        m.load_state_dict(sd)
    message = str(err.value)
    problems = message.split("\n\t")[1:]
    assert problems[0].startswith('Missing key(s) in state_dict: "1.running_var"')
    assert problems[1].startswith('Unexpected key(s) in state_dict: "2.weight"')
    assert "size mismatch for 1.weight" in message
    named = [
        p.split('"')[1]
        for p in problems
        if p.startswith(("While copying", "The checkpoint's arrays for"))
    ]
    assert sorted(named) == sorted(bad_keys)
    assert len(problems) == 3 + len(bad_keys)
    after = state_of(m)
    assert _identities(m) == ids
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)


@pytest.mark.parametrize("value", [7, 2**31 - 1, -(2**31)])
@pytest.mark.parametrize(
    "make", [lambda v: np.array(v, np.int64), torch.tensor], ids=["np", "torch"]
)
def test_int64_that_fits_in_int32_still_loads_as_torch_loads_it(value, make):
    t, j = TORCH.nn.BatchNorm1d(2), JM.nn.BatchNorm1d(2)
    t.load_state_dict({**t.state_dict(), "num_batches_tracked": torch.tensor(value)})
    j.load_state_dict({**j.state_dict(), "num_batches_tracked": make(value)})
    assert j.num_batches_tracked.dtype == jnp.int32
    assert int(j.num_batches_tracked) == int(t.num_batches_tracked)


def test_overflow_into_a_narrow_integer_buffer_raises_where_torch_wraps():
    class Counter(jm.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("count", jnp.zeros((), jnp.uint8))

    t = torch.nn.Module()
    t.register_buffer("count", torch.zeros((), dtype=torch.uint8))
    t.load_state_dict({"count": torch.tensor(300)})
    assert int(t.count) == 300 % 256  # PyTorch wraps silently
    with pytest.raises(RuntimeError, match=r'named "count".*300 \(int64\), which uint8'):
        Counter().load_state_dict({"count": torch.tensor(300)})
    # Floats into an integer buffer are cast as PyTorch casts them, unless out of range.
    t.load_state_dict({"count": torch.tensor(3.7)})
    c = Counter()
    c.load_state_dict({"count": np.array(3.7, np.float32)})
    assert int(c.count) == int(t.count)
    with pytest.raises(RuntimeError, match=r'named "count".*nan'):
        c.load_state_dict({"count": np.array(np.nan, np.float32)})
    assert int(c.count) == int(t.count)


def test_meta_into_meta_copies_nothing_as_in_torch():
    t = torch.nn.Linear(2, 2, device="meta")
    t.load_state_dict(torch.nn.Linear(2, 2, device="meta").state_dict())  # no error, no warning
    with jm.device("meta"):
        j = jm.nn.Linear(2, 2)
    meta = {k: torch.empty(tuple(v.shape), device="meta") for k, v in t.state_dict().items()}
    assert j.load_state_dict(meta) == ([], [])
    assert jm.is_meta(j.weight) and jm.is_meta(j.bias)


@pytest.mark.parametrize("make", [lambda: np.zeros(0, np.int64), lambda: torch.zeros(0).long()])
def test_an_empty_int64_array_loads_into_an_empty_int32_buffer(make):
    class Ids(jm.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("ids", jnp.zeros((0,), jnp.int32))

    m = Ids()
    assert m.load_state_dict({"ids": make()}) == ([], [])
    assert m.ids.shape == (0,) and m.ids.dtype == jnp.int32
