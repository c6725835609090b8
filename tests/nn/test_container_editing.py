"""Container slicing, append/insert/extend and update against live PyTorch.

Complements tests/nn/test_containers.py: each scenario runs on both frameworks
and records every intermediate view (repr, child and parameter names) and
every result or error, so the two logs must be identical.
"""

from collections import OrderedDict

import jax.numpy as jnp
import numpy as np
import pytest
from torch_ref import JM, TORCH, canon, outcome, outcomes

import jmodule as jm


def _view(m):
    names = [k for k, _ in m.named_modules(remove_duplicate=False)]
    return repr(m), names, [k for k, _ in m.named_parameters()]


def _lin(s, n):
    return s.nn.Linear(n, n)


SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


@scenario
def sequential_slices_keep_names_and_objects(s):
    named = s.nn.Sequential(
        OrderedDict(a=_lin(s, 1), b=s.nn.ReLU(), c=_lin(s, 2), d=s.nn.Identity())
    )
    log = []
    for idx in (slice(1, 3), slice(None, None, -2), slice(-2, None), slice(3, 1), slice(9, 12)):
        part = named[idx]
        log.append((_view(part), type(part).__name__))
        log.append([m is named[i] for m, i in zip(part, range(len(named))[idx])])
    log.append(len(named[1:][1:]))
    return log


@scenario
def sequential_append_insert_extend(s):
    seq = s.nn.Sequential()
    log = [seq.append(_lin(s, 1)) is seq]
    seq.insert(0, s.nn.ReLU())
    seq.insert(len(seq), s.nn.Identity())
    seq.insert(-len(seq), _lin(s, 2))
    log.append(_view(seq))
    log.append(outcome(lambda: seq.insert(-len(seq) - 1, s.nn.ReLU())))
    log.append(outcome(lambda: seq.append(3)))
    log.append(seq.extend(m for m in [s.nn.Identity(), _lin(s, 3)]) is seq)
    log.append(_view(seq))
    seq.extend(s.nn.ModuleList([s.nn.ReLU()]))
    seq.extend(s.nn.Sequential(_lin(s, 4)))
    log.append(_view(seq))
    log.append(outcome(lambda: seq.extend(3)))
    log.append(_view(seq))
    return log


@scenario
def module_list_insert_extend_slice(s):
    ml = s.nn.ModuleList()
    ml.insert(0, _lin(s, 1))
    ml.insert(1, s.nn.ReLU())
    ml.insert(1, s.nn.Identity())
    log = [_view(ml)]
    log.append(outcome(lambda: ml.insert(-1, s.nn.ReLU())))
    log.append(_view(ml))
    log.append(ml.extend(m for m in (_lin(s, 2), s.nn.ReLU())) is ml)
    ml += s.nn.ModuleList([s.nn.Identity()])
    ml += (s.nn.ReLU(),)
    log.append(_view(ml))
    log.append(outcome(lambda: ml.extend({"x": s.nn.ReLU()})))
    for idx in (slice(2, None), slice(None, None, 3), slice(-2, -5, -1), slice(50, 60)):
        part = ml[idx]
        log.append((_view(part), [m is ml[i] for m, i in zip(part, range(len(ml))[idx])]))
    log.append(_view(ml + [s.nn.Identity()]))  # noqa: RUF005 (ModuleList.__add__)
    return log


@scenario
def module_dict_update_forms(s):
    md = s.nn.ModuleDict()
    md.update({"z": _lin(s, 1), "a": s.nn.ReLU()})  # a dict keeps insertion order
    md.update(OrderedDict(m=s.nn.Identity()))
    md.update(s.nn.ModuleDict({"b": _lin(s, 2)}))
    md.update([("c", s.nn.ReLU()), ["z", s.nn.Identity()]])  # "z" replaced in place
    md.update(kv for kv in [("g", _lin(s, 3))])
    md.update((("t", s.nn.ReLU()),))
    log = [_view(md), list(md.keys())]
    log.append(outcome(lambda: md.update("ab")))
    log.append(outcome(lambda: md.update([("k", s.nn.ReLU(), 3)])))
    log.append(outcome(lambda: md.update(5)))
    log.append(outcome(lambda: md.update({"bad.key": s.nn.ReLU()})))
    log.append(_view(md))
    return log


@scenario
def parameter_dict_update_forms(s):
    pd = s.nn.ParameterDict()
    pd.update({"z": s.arr([1.0]), "a": s.param([2.0])})  # a plain dict is sorted
    pd.update(OrderedDict(y=s.arr([3.0]), b=s.arr([4.0])))  # an OrderedDict is not
    pd.update(s.nn.ParameterDict({"c": s.arr([5.0])}))
    pd.update([("z", s.arr([6.0])), ["d", None]])
    pd.update(kv for kv in [("e", "text")])
    log = [_view(pd), list(pd.keys()), [canon(v) for v in pd.values()]]
    log.append([type(v).__name__ for v in pd.values()])
    log.append(outcome(lambda: pd.update(5)))
    log.append(outcome(lambda: pd.update([("k",)])))
    log.append(outcome(lambda: pd.update(["ab", "c"])))
    log.append(_view(pd))
    return log


@pytest.mark.torch
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_container_scenario_matches_torch(name):
    t, j = outcomes(SCENARIOS[name])
    assert t[0] == "ok", t
    assert j == t


@pytest.mark.torch
def test_compiled_sequential_follows_append_insert_and_slicing():
    t_seq, j_seq = (
        side.nn.Sequential(side.nn.Linear(3, 4), side.nn.ReLU()) for side in (TORCH, JM)
    )
    j_seq.load_state_dict(t_seq.state_dict())
    j_seq.compile()
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)

    def same():
        want = t_seq(TORCH.arr(x)).detach().numpy()
        np.testing.assert_allclose(np.asarray(j_seq(jnp.asarray(x))), want, rtol=1e-5, atol=1e-6)

    same()
    for side, seq in ((TORCH, t_seq), (JM, j_seq)):
        seq.append(side.nn.Linear(4, 2))
    j_seq[-1].load_state_dict(t_seq[-1].state_dict())
    same()
    for side, seq in ((TORCH, t_seq), (JM, j_seq)):
        seq.insert(1, side.nn.Identity())
    same()
    head = j_seq[:2]
    np.testing.assert_allclose(
        np.asarray(head(jnp.asarray(x))),
        t_seq[:2](TORCH.arr(x)).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    assert head[0] is j_seq[0]


def test_module_list_slices_share_parameters_with_the_original():
    ml = jm.nn.ModuleList([jm.nn.Linear(2, 2) for _ in range(3)])
    part = ml[1:]
    assert [p is q for p, q in zip(part.parameters(), list(ml.parameters())[2:])] == [True] * 4
