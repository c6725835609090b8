"""Sequential, ModuleList, ModuleDict, ParameterList and ParameterDict against live PyTorch.

Each scenario is one script run on both frameworks; it records what the
container looks like (repr, child names) after each operation and what each
operation returned or raised.
"""

from collections import OrderedDict

import numpy as np
import pytest
from torch_ref import canon, outcome, outcomes


def _names(m):
    return [k for k, _ in m.named_modules(remove_duplicate=False)]


def _view(m):
    return repr(m), _names(m), [k for k, _ in m.named_parameters()]


def _lin(s, i, o=None):
    return s.nn.Linear(i, o or i)


SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


# ------------------------------------------------------------------ Sequential


@scenario
def sequential_indexing(s):
    seq = s.nn.Sequential(_lin(s, 1), s.nn.ReLU(), _lin(s, 2), s.nn.Identity())
    named = s.nn.Sequential(OrderedDict(a=_lin(s, 1), b=s.nn.ReLU(), c=s.nn.Identity()))
    log = [_view(seq), _view(named), len(seq), [type(m).__name__ for m in seq]]
    for idx in (0, -1, 3, 4, -5, slice(1, 3), slice(None, None, -1), slice(5, 9)):
        log.append(outcome(lambda i=idx: _view(seq[i]) if isinstance(i, slice) else seq[i]))
    log.append(_view(named[1:]))
    log.append(outcome(lambda: seq["0"]))
    return log


@scenario
def sequential_mutation(s):
    seq = s.nn.Sequential(_lin(s, 1), s.nn.ReLU(), _lin(s, 2))
    log = []
    seq[1] = s.nn.Identity()
    log.append(_view(seq))
    log.append(outcome(lambda: seq.__setitem__(5, s.nn.ReLU())))
    log.append(outcome(lambda: seq.__setitem__(0, 3)))
    del seq[0]
    log.append(_view(seq))
    seq.append(_lin(s, 3))
    log.append(_view(seq))
    seq.insert(1, s.nn.ReLU())
    seq.insert(-1, s.nn.Identity())
    seq.insert(len(seq), _lin(s, 4))
    log.append(_view(seq))
    log.append(outcome(lambda: seq.insert(99, s.nn.ReLU())))
    log.append(outcome(lambda: seq.insert(0, "x")))
    log.append(canon(seq.pop(1)))
    log.append(_view(seq))
    seq.extend([s.nn.ReLU(), s.nn.Identity()])
    log.append(_view(seq))
    del seq[1:3]
    log.append(_view(seq))
    log.append(outcome(lambda: seq.__delitem__(10)))
    return log


@scenario
def sequential_arithmetic(s):
    a = s.nn.Sequential(_lin(s, 1), s.nn.ReLU())
    b = s.nn.Sequential(s.nn.Identity())
    log = [_view(a + b)]
    log.append(outcome(lambda: a + [s.nn.ReLU()]))  # noqa: RUF005 (the error is tested)
    c = a
    c += b
    log.append((c is a, _view(a)))
    log.append(outcome(lambda: a.__iadd__(3)))
    log.append(_view(b * 3))
    log.append(_view(2 * b))
    log.append(outcome(lambda: b * 0))
    log.append(outcome(lambda: b * 1.5))
    d = s.nn.Sequential(s.nn.ReLU(), s.nn.Identity())
    d *= 2
    log.append(_view(d))
    log.append(d[0] is d[2])
    return log


@scenario
def sequential_forward_and_empty(s):
    seq = s.nn.Sequential(s.nn.ReLU(), s.nn.Identity())
    x = s.arr([-1.0, 2.0])
    return [canon(seq(x)), canon(s.nn.Sequential()(x)), _view(s.nn.Sequential())]


# ------------------------------------------------------------------ ModuleList


@scenario
def module_list_operations(s):
    ml = s.nn.ModuleList([_lin(s, 1), s.nn.ReLU()])
    log = [_view(ml), len(ml)]
    ml.append(_lin(s, 2))
    ml.extend([s.nn.Identity(), s.nn.Identity()])
    ml += [s.nn.ReLU()]
    log.append(_view(ml))
    ml.insert(0, s.nn.Identity())
    ml.insert(3, _lin(s, 3))
    log.append(_view(ml))
    for idx in (0, -1, 7, -9, slice(1, 4), slice(None, None, 2)):
        log.append(outcome(lambda i=idx: _view(ml[i]) if isinstance(i, slice) else ml[i]))
    ml[2] = s.nn.Identity()
    log.append(outcome(lambda: ml.__setitem__(20, s.nn.ReLU())))
    log.append(canon(ml.pop(-2)))
    del ml[0]
    del ml[::2]
    log.append(_view(ml))
    log.append(_view(ml + s.nn.ModuleList([s.nn.ReLU()])))
    log.append(outcome(lambda: ml.extend(5)))
    log.append(outcome(lambda: ml.append("x")))
    log.append(outcome(lambda: s.nn.ModuleList([1])))
    return log


@scenario
def module_list_repr_compression(s):
    ident, relu = s.nn.Identity, s.nn.ReLU
    lists = [
        [],
        [ident()],
        [ident(), ident()],
        [ident(), relu(), relu(), relu(), ident(), ident()],
        [_lin(s, 2), _lin(s, 2), _lin(s, 3), _lin(s, 2)],
        [s.nn.Sequential(_lin(s, 2), relu()) for _ in range(3)],
        [s.nn.ModuleList([ident(), ident()]), s.nn.ModuleList([ident(), ident()])],
    ]
    return [repr(s.nn.ModuleList(mods)) for mods in lists]


# ------------------------------------------------------------------ ModuleDict


@scenario
def module_dict_operations(s):
    md = s.nn.ModuleDict({"b": _lin(s, 1), "a": s.nn.ReLU()})  # insertion order kept
    log = [_view(md), list(md), list(md.keys()), len(md), "a" in md, "z" in md]
    md["c"] = s.nn.Identity()
    md.update([("d", s.nn.ReLU()), ["a", _lin(s, 2)]])
    md.update(OrderedDict(z=s.nn.Identity(), e=s.nn.ReLU()))
    md.update(s.nn.ModuleDict({"f": s.nn.Identity()}))
    log.append(_view(md))
    log.append([(k, type(v).__name__) for k, v in md.items()])
    log.append([type(v).__name__ for v in md.values()])
    log.append(canon(md.pop("c")))
    del md["b"]
    log.append(_view(md))
    log.append(outcome(lambda: md["missing"]))
    log.append(outcome(lambda: md.update(3)))
    log.append(outcome(lambda: md.update([("a", s.nn.ReLU(), 1)])))
    log.append(outcome(lambda: md.update([3])))
    log.append(outcome(lambda: md.__setitem__("x.y", s.nn.ReLU())))
    log.append(outcome(lambda: md.__setitem__("k", 1)))
    md.clear()
    log.append((_view(md), len(md)))
    return log


# ------------------------------------------------------------------ ParameterList


@scenario
def parameter_list_operations(s):
    pl = s.nn.ParameterList([s.param(np.ones((2, 3))), s.arr([1.0, 2.0])])
    log = [_view(pl), len(pl), [canon(p) for p in pl]]
    pl.append(s.arr(np.zeros((1, 1, 4)), dtype="float16"))
    pl.append("tag")
    pl.append(None)
    pl.extend([s.arr([5.0])])
    pl += [s.param(7.0, requires_grad=False)]
    log.append(_view(pl))
    log.append([canon(p) for p in pl])
    log.append([getattr(p, "requires_grad", None) for p in pl])
    pl[0] = s.arr([9.0])
    log.append(canon(pl[0]))
    log.append(outcome(lambda: pl[10]))
    log.append(outcome(lambda: pl.__setitem__(-20, s.arr([1.0]))))
    log.append(_view(pl[1:4]))
    log.append(_view(pl[::-3]))
    log.append(outcome(lambda: pl.extend(3)))
    log.append(outcome(lambda: pl.extend(s.arr([1.0, 2.0]))))
    log.append(outcome(lambda: pl(1)))
    log.append(list(dict(pl.named_parameters())))
    log.append(_view(s.nn.ParameterList()))
    return log


# ------------------------------------------------------------------ ParameterDict


@scenario
def parameter_dict_operations(s):
    pd = s.nn.ParameterDict({"w": s.arr(np.ones((2, 2))), "b": s.param([0.0, 1.0])})  # sorted
    log = [_view(pd), list(pd), list(pd.keys()), list(reversed(pd)), "w" in pd, len(pd)]
    pd["n"] = None
    pd["s"] = "text"
    pd["h"] = s.arr([1, 2], dtype="float16")
    pd.update(OrderedDict(z=s.arr([1.0]), a=s.arr([2.0])))  # order kept
    pd.update([("m", s.arr([3.0]))])
    log.append(_view(pd))
    log.append([(k, canon(v)) for k, v in pd.items()])
    log.append([canon(v) for v in pd.values()])
    log.append(canon(pd.get("w")))
    log.append(pd.get("missing", "default"))
    log.append(canon(pd.setdefault("w", s.arr([5.0]))))
    log.append(canon(pd.setdefault("new", s.arr([5.0]))))
    log.append(canon(pd.pop("b")))
    log.append(canon(pd.popitem()))
    log.append(outcome(lambda: pd[1]))
    log.append(outcome(lambda: pd["missing"]))
    log.append(outcome(lambda: pd.update(3)))
    log.append(outcome(lambda: pd.update([("a", 1, 2)])))
    log.append(outcome(lambda: pd(1)))
    log.append(_view(pd.copy()))
    log.append(pd.copy()["w"] is pd["w"])
    log.append(_view(pd.fromkeys(["p", "q"], s.arr([1.0]))))
    log.append(_view(pd | s.nn.ParameterDict({"extra": s.arr([0.5])})))
    log.append(_view(s.nn.ParameterDict({"extra": s.arr([0.5])}) | pd))
    other = pd
    other |= s.nn.ParameterDict({"w": s.arr([4.0])})
    log.append((other is pd, _view(pd), canon(pd["w"])))
    log.append(list(dict(pd.named_parameters())))
    pd.clear()
    log.append((_view(pd), len(pd)))
    return log


# Two wordings jmodule does not copy: torch's missing space in "; is<type>" and
# its name for the array type in ParameterList.extend's message.
_WORDING = (
    ("should be Iterable; is", "should be Iterable; is "),
    ("but got Tensor", "but got jax.Array"),
)


def _reworded(x):
    if isinstance(x, tuple) and len(x) == 3 and x[0] == "raise":
        msg = x[2]
        for old, new in _WORDING:
            msg = msg.replace(old, new)
        return (*x[:2], msg)
    return [_reworded(v) for v in x] if isinstance(x, list) else x


@pytest.mark.torch
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_container_scenario_matches_torch(name):
    t, j = outcomes(SCENARIOS[name])
    assert t[0] == "ok", t
    assert j == ("ok", _reworded(t[1]))


@pytest.mark.torch
def test_sequential_forward_values_match_torch():
    t, j = outcomes(
        lambda s: s.nn.Sequential(s.nn.ReLU(), s.nn.Sequential(s.nn.Identity()))(
            s.arr([[-1.0, 0.5], [2.0, -3.0]])
        )
    )
    assert t[0] == "ok"
    assert j == t


def test_containers_hold_the_objects_given():
    from jmodule import nn

    lin = nn.Linear(2, 2)
    seq = nn.Sequential(lin, lin)
    assert seq[0] is seq[1] is lin
    assert len(list(seq.parameters())) == 2
    p = nn.Parameter(np.ones(2))
    plist = nn.ParameterList([p])
    assert plist[0] is p
    pdict = nn.ParameterDict({"p": p})
    assert pdict["p"] is p
    ml = nn.ModuleList([lin])
    assert ml[0] is lin and ml[-1:][0] is lin
