"""The Module object model against live PyTorch: registration, attribute routing,
lookup, iteration, modes, repr, copying, and the basic layers' numerics.

Each test builds the same tree in torch and in jmodule (``torch_ref``) and
compares what both return or raise.
"""

import copy
import math
import pickle

import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from torch_ref import (
    FORWARD_IN,
    JM,
    SIDES,
    TORCH,
    TREES,
    assert_same_state,
    build,
    canon,
    cls,
    dtype_name,
    inputs,
    outcome,
    outcomes,
    run_forward,
    to_numpy,
)

import jmodule as jm
from jmodule import nn

TREE_NAMES = sorted(TREES)
FORWARD_TREES = sorted(FORWARD_IN)


def layout(m):
    """Where each name lives: parameters, buffers, modules, non-persistent, plain attributes."""
    plain = sorted(k for k in m.__dict__ if not k.startswith("_") and k != "training")
    return (
        list(m._parameters),
        list(m._buffers),
        list(m._modules),
        sorted(m._non_persistent_buffers_set),
        plain,
    )


def _base(s):
    m = s.nn.Module()
    m.attr = 1
    m.sub = s.nn.Linear(1, 1)
    m.register_buffer("buf", s.arr([1.0]))
    m.register_buffer("np_buf", s.arr([1.0]), persistent=False)
    m.p = s.param([1.0])
    m.register_parameter("nonep", None)
    return m


# ------------------------------------------------------------------ construction


@pytest.mark.torch
def test_module_init_rejects_arguments_like_torch():
    for args, kwargs in [((1,), {}), ((1, 2), {}), ((), {"x": 1})]:
        t, j = outcomes(lambda s, a=args, k=kwargs: s.nn.Module(*a, **k))
        assert t[:2] == ("raise", "TypeError")
        assert j == t


@pytest.mark.torch
def test_call_super_init_forwards_arguments_like_torch():
    def make(s):
        class Mixin:
            def __init__(self, *args, **kwargs):
                self.mixin_got = (args, kwargs)

        class WithMixin(s.nn.Module, Mixin):
            call_super_init = True

        return WithMixin(1, k=2).mixin_got

    t, j = outcomes(make)
    assert t == ("ok", ((1,), {"k": 2}))
    assert j == t


@pytest.mark.torch
def test_base_forward_is_not_implemented():
    t, j = outcomes(lambda s: s.nn.Module()(1))
    assert t[:2] == ("raise", "NotImplementedError")
    assert j == t


# ------------------------------------------------------------------ registration

REG_NAMES = ["new", "a.b", "", 3, "attr", "sub", "buf", "p", "nonep", "training", "forward"]
REG_VALUES = {
    "none": lambda s: None,
    "param": lambda s: s.param([2.0]),
    "array": lambda s: s.arr([2.0]),
    "module": lambda s: s.nn.ReLU(),
    "int": lambda s: 5,
    "str": lambda s: "x",
}


def _jm_names_param_type(torch_outcome, value_kind):
    """jmodule names a Parameter's own type where torch's names its tensor type."""
    if value_kind == "param" and torch_outcome[0] == "raise":
        msg = torch_outcome[2].replace("jax.Array", "jmodule.nn.parameter.Parameter", 1)
        return (*torch_outcome[:2], msg)
    return torch_outcome


@pytest.mark.torch
@pytest.mark.parametrize("op", ["register_parameter", "register_buffer", "add_module"])
@pytest.mark.parametrize("value", list(REG_VALUES))
def test_registration_results_and_errors_match_torch(op, value):
    for name in REG_NAMES:

        def register(s, name=name):
            m = _base(s)
            getattr(m, op)(name, REG_VALUES[value](s))
            return layout(m), canon(getattr(m, name))

        t, j = outcomes(register)
        if op == "add_module":
            t = _jm_names_param_type(t, value)
        if op == "register_buffer" and value == "param" and t[0] == "ok":
            # torch keeps the Parameter object as the buffer; jmodule keeps its array
            t = ("ok", (t[1][0], ("array", *t[1][1][1:])))
        assert j == t, (op, name, value)


@pytest.mark.torch
def test_register_module_is_add_module():
    for name in REG_NAMES:
        for value in REG_VALUES.values():
            assert outcome(lambda n=name, v=value: _base(JM).register_module(n, v(JM))) == outcome(
                lambda n=name, v=value: _base(JM).add_module(n, v(JM))
            )


@pytest.mark.torch
def test_register_buffer_persistence_and_reregistration_match_torch():
    def steps(s):
        m = s.nn.Module()
        m.register_buffer("a", s.arr([1.0]), persistent=False)
        first = (layout(m), list(m.state_dict()))
        m.register_buffer("a", s.arr([2.0]))  # re-registering flips persistence back
        second = (layout(m), list(m.state_dict()), canon(m.a))
        m.register_buffer("a", None, persistent=False)
        return first, second, layout(m), list(m.state_dict()), list(dict(m.named_buffers()))

    t, j = outcomes(steps)
    assert t[0] == "ok"
    assert j == t


def test_register_buffer_accepts_numpy_arrays():
    m = nn.Module()
    m.register_buffer("x", np.arange(3.0, dtype=np.float32))
    assert isinstance(m.x, type(jnp.zeros(1)))
    np.testing.assert_array_equal(np.asarray(m.x), np.arange(3.0))


# ------------------------------------------------------------------ attribute routing

SET_NAMES = ["attr", "sub", "buf", "np_buf", "p", "nonep", "new", "forward", "training"]
SET_VALUES = {
    **REG_VALUES,
    "buffer": lambda s: s.nn.Buffer(s.arr([3.0])),
    "np_buffer": lambda s: s.nn.Buffer(s.arr([3.0]), persistent=False),
}


@pytest.mark.torch
@pytest.mark.parametrize("value", list(SET_VALUES))
def test_setattr_routing_matches_torch(value):
    for name in SET_NAMES:

        def assign(s, name=name):
            m = _base(s)
            setattr(m, name, SET_VALUES[value](s))
            return layout(m), canon(getattr(m, name)), list(m.state_dict())

        t, j = outcomes(assign)
        if value in ("buffer", "np_buffer") and t[0] == "raise":
            # torch's Buffer *is* a tensor; jmodule's is a marker object
            t = (*t[:2], t[2].replace("jax.Array", "jmodule.nn.parameter.Buffer", 1))
        assert j == t, (name, value)


@pytest.mark.torch
def test_setattr_messages_name_the_wrong_type():
    m = _base(JM)
    with pytest.raises(TypeError, match=r"cannot assign 'int' as parameter 'p' \(jmodule"):
        m.p = 3
    with pytest.raises(TypeError, match=r"cannot assign 'jax.Array' as child module 'sub'"):
        m.sub = jnp.ones(1)
    with pytest.raises(TypeError, match=r"cannot assign 'str' as buffer 'buf'"):
        m.buf = "no"


@pytest.mark.torch
@pytest.mark.parametrize("name", [*SET_NAMES, "missing"])
def test_getattr_and_delattr_match_torch(name):
    t, j = outcomes(lambda s: canon(getattr(_base(s), name)))
    assert j == t

    def delete(s):
        m = _base(s)
        delattr(m, name)
        return layout(m), list(m.state_dict()), hasattr(m, name)

    t, j = outcomes(delete)
    assert j == t


@pytest.mark.torch
def test_getattr_error_message_is_torchs():
    t, j = outcomes(lambda s: cls(s, "Net")().missing_thing)
    assert t == ("raise", "AttributeError", "'Net' object has no attribute 'missing_thing'")
    assert j == t


@pytest.mark.torch
@pytest.mark.parametrize(
    "kind", ["param", "module", "buffer", "reg_buffer", "reg_param", "add_module", "plain"]
)
def test_assignment_before_init_matches_torch(kind):
    def make(s):
        class Early(s.nn.Module):
            def __init__(self):
                if kind == "param":
                    self.w = s.param([1.0])
                elif kind == "module":
                    self.c = s.nn.ReLU()
                elif kind == "buffer":
                    self.b = s.nn.Buffer(s.arr([1.0]))
                elif kind == "reg_buffer":
                    self.register_buffer("b", s.arr([1.0]))
                elif kind == "reg_param":
                    self.register_parameter("b", s.param([1.0]))
                elif kind == "add_module":
                    self.add_module("b", s.nn.ReLU())
                else:
                    self.x = 1
                super().__init__()

        return layout(Early())

    t, j = outcomes(make)
    assert j == t


@pytest.mark.torch
def test_dir_lists_members_and_containers_hide_indices():
    def listing(s):
        names = ("stem", "blocks", "scale", "offset", "cache", "unused", "empty", "nothing")
        net = cls(s, "Net")()
        seq = s.nn.Sequential(s.nn.ReLU(), s.nn.ReLU())
        lst = s.nn.ModuleList([s.nn.ReLU()])
        plist = s.nn.ParameterList([s.arr([1.0])])
        return (
            [n for n in names if n in dir(net)],
            [k for k in dir(seq) if k.isdigit()],
            [k for k in dir(lst) if k.isdigit()],
            [k for k in dir(plist) if k.isdigit()],
        )

    t, j = outcomes(listing)
    assert t[0] == "ok"
    assert j == t


# ------------------------------------------------------------------ lookup

_EXTRA_TARGETS = [
    "",
    "nope",
    "stem.nope",
    "stem.weight.x",
    "blocks.5",
    "blocks.0.9.weight",
    "unused",
    "empty",
    "nothing",
    "cache",
    "training",
    "0.nope",
    "heads.cls.bias",
    "seq.mask",
    "plist.2",
    "ordered.y",
]


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
@pytest.mark.parametrize("method", ["get_submodule", "get_parameter", "get_buffer"])
def test_get_submodule_parameter_buffer_match_torch(name, method):
    t, j = build(name)
    targets = {k for k, _ in t.named_modules(remove_duplicate=False)}
    targets |= {k for k, _ in t.named_parameters(remove_duplicate=False)}
    targets |= {k for k, _ in t.named_buffers(remove_duplicate=False)}
    for target in sorted(targets) + _EXTRA_TARGETS:
        expected = outcome(lambda tg=target: getattr(t, method)(tg))
        assert outcome(lambda tg=target: getattr(j, method)(tg)) == expected, target


@pytest.mark.torch
def test_get_parameter_and_buffer_return_the_registered_objects():
    j = cls(JM, "Net")()
    assert j.get_parameter("blocks.1.0.weight") is j.blocks[1][0].weight
    assert j.get_parameter("scale") is j.scale
    assert j.get_buffer("blocks.2.1.running_var") is j.blocks[2][1].running_var
    assert j.get_buffer("cache") is j.cache
    assert j.get_submodule("heads.cls") is j.heads["cls"]
    assert j.get_submodule("") is j


SET_TARGETS = [
    "stem",
    "blocks.0.1",
    "heads.new",
    "new",
    "",
    "scale",
    "offset",
    "nothing",
    "unused",
    "nope.x",
    "blocks.9",
    "blocks.0.9",
    "heads.cls.weight",
    "stem.new",
]


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("target", SET_TARGETS)
def test_set_submodule_matches_torch(target):
    values = {"linear": lambda s: s.nn.Linear(1, 1), "int": lambda s: 3, "none": lambda s: None}
    for value in values.values():
        for strict in (None, False, True):

            def replace(s, value=value, strict=strict):
                m = cls(s, "Net")()
                kwargs = {} if strict is None else {"strict": strict}
                m.set_submodule(target, value(s), **kwargs)
                return [k for k, _ in m.named_modules()], repr(m), layout(m)

            t, j = outcomes(replace)
            assert j == t, (target, strict)


@pytest.mark.torch
def test_set_submodule_puts_the_given_object():
    j = cls(JM, "Net")()
    new = nn.Linear(6, 6)
    j.set_submodule("blocks.1.0", new, strict=True)
    assert j.blocks[1][0] is new
    assert j.get_parameter("blocks.1.0.weight") is new.weight


# ------------------------------------------------------------------ iteration


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_named_modules_and_children_match_torch(name):
    t, j = build(name)
    for remove_duplicate in (True, False):
        for prefix in ("", "root"):
            kw = {"prefix": prefix, "remove_duplicate": remove_duplicate}
            assert [k for k, _ in j.named_modules(**kw)] == [k for k, _ in t.named_modules(**kw)]
            assert [canon(m) for _, m in j.named_modules(**kw)] == [
                canon(m) for _, m in t.named_modules(**kw)
            ]
        kw = {"remove_duplicate": remove_duplicate}
        assert [canon(m) for m in j.modules(**kw)] == [canon(m) for m in t.modules(**kw)]
    assert [canon(m) for m in j.modules()] == [canon(m) for m in t.modules()]
    assert canon(list(j.named_children())) == canon(list(t.named_children()))
    assert canon(list(j.children())) == canon(list(t.children()))


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_named_parameters_and_buffers_match_torch(name):
    t, j = build(name)
    for method in ("named_parameters", "named_buffers"):
        for remove_duplicate in (True, False):
            for prefix in ("", "net"):
                for recurse in (True, False):
                    kw = {
                        "prefix": prefix,
                        "recurse": recurse,
                        "remove_duplicate": remove_duplicate,
                    }
                    expected = canon(list(getattr(t, method)(**kw)))
                    assert canon(list(getattr(j, method)(**kw))) == expected, (method, kw)
    for recurse in (True, False):
        assert canon(list(j.parameters(recurse))) == canon(list(t.parameters(recurse)))
        assert canon(list(j.buffers(recurse=recurse))) == canon(list(t.buffers(recurse=recurse)))


@pytest.mark.torch
def test_iteration_yields_registered_objects():
    j = cls(JM, "Tied")()
    params = dict(j.named_parameters())
    assert params["enc.weight"] is j.enc.weight is j.dec.weight
    assert "dec.weight" not in params
    assert [id(p) for p in j.parameters()] == [id(p) for p in params.values()]
    assert dict(j.named_buffers())["mask"] is j.mask
    assert next(iter(j.named_modules(remove_duplicate=False)))[1] is j


@pytest.mark.torch
@pytest.mark.parametrize("name", ["net", "tied", "deep"])
def test_named_modules_memo_matches_torch(name):
    t, j = build(name)
    subs = [k for k, _ in t.named_modules()][1:4]
    results = []
    for m in (t, j):
        memo = {m.get_submodule(k) for k in subs}  # these subtrees are skipped
        results.append(([k for k, _ in m.named_modules(memo=memo, prefix="p")], len(memo)))
    assert results[1] == results[0]
    assert len(results[0][0]) < len(list(t.named_modules()))


@pytest.mark.torch
def test_named_modules_memo_is_filled_only_when_removing_duplicates():
    for remove_duplicate in (True, False):
        sizes = []
        for s in SIDES:
            memo = set()
            list(cls(s, "Tied")().named_modules(memo=memo, remove_duplicate=remove_duplicate))
            sizes.append(len(memo))
        assert sizes[1] == sizes[0]


# ------------------------------------------------------------------ apply, modes, grads


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_apply_visits_children_first_like_torch(name):
    t, j = build(name)
    orders = []
    for m in (t, j):
        paths = {}
        for k, sub in m.named_modules(remove_duplicate=False):
            paths.setdefault(id(sub), k)
        order = []
        assert m.apply(lambda mod, o=order, p=paths: o.append(p[id(mod)])) is m
        orders.append(order)
    assert orders[1] == orders[0]


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_train_eval_flags_match_torch(name):
    def flags(s):
        m = TREES[name](s)
        out = []
        record = lambda: out.append([x.training for x in m.modules(remove_duplicate=False)])
        record()
        assert m.eval() is m
        record()
        children = list(m.children())
        if children:
            assert children[-1].train() is children[-1]
            record()
        assert m.train(False) is m
        record()
        assert m.train() is m
        record()
        return out

    t, j = outcomes(flags)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
@pytest.mark.parametrize("mode", ["True", 1, None, 0.0])
def test_train_rejects_non_bool_like_torch(mode):
    t, j = outcomes(lambda s: s.nn.Linear(1, 1).train(mode))
    assert t == ("raise", "ValueError", "training mode is expected to be boolean")
    assert j == t


@pytest.mark.torch
def test_requires_grad_matches_torch():
    def flags(s):
        m = cls(s, "Net")()
        out = []
        assert m.requires_grad_(False) is m
        out.append([p.requires_grad for p in m.parameters()])
        assert m.blocks[1].requires_grad_() is m.blocks[1]
        out.append([p.requires_grad for _, p in m.named_parameters()])
        m.requires_grad_(True)
        out.append([p.requires_grad for p in m.parameters()])
        return out

    t, j = outcomes(flags)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_zero_grad_matches_torch():
    def grads(s):
        m = cls(s, "Tied")()
        for i, p in enumerate(m.parameters()):
            if i % 2 == 0:
                p.grad = s.arr(np.full(p.shape, i + 1.0))
        before = [canon(p.grad) for p in m.parameters()]
        m.zero_grad(set_to_none=False)
        zeroed = [canon(p.grad) for p in m.parameters()]
        m.zero_grad()
        return before, zeroed, [p.grad for p in m.parameters()]

    t, j = outcomes(grads)
    assert t[0] == "ok"
    assert j == t


# ------------------------------------------------------------------ repr


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_repr_is_torchs(name):
    t, j = build(name)
    assert repr(j) == repr(t)
    assert str(j) == str(t)


@pytest.mark.torch
def test_repr_with_custom_extra_repr_and_none_children():
    def text(s):
        m = cls(s, "Extra")()
        m.add_module("gone", None)
        m.inner = cls(s, "OneLine")()
        m.inner.leaf = s.nn.Identity(3, k=1)
        return repr(m)

    t, j = outcomes(text)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_jupyter_html_exists_and_names_the_tree():
    import treescope

    net = cls(JM, "Net")()
    assert net._repr_mimebundle_()["text/html"].startswith("<")  # treescope's (compressed) HTML
    text = treescope.render_to_text(net)
    assert "Net(" in text and "BatchNorm1d(" in text


# ------------------------------------------------------------------ copying


def _identity_groups(m, method):
    """The partition of names by object identity, e.g. tied parameters grouped."""
    groups = {}
    for k, v in getattr(m, method)(remove_duplicate=False):
        groups.setdefault(id(v), []).append(k)
    return sorted(groups.values())


def _pickle_copy(m):
    return pickle.loads(pickle.dumps(m))


@pytest.mark.torch
@pytest.mark.parametrize("copier", [copy.deepcopy, _pickle_copy], ids=["deepcopy", "pickle"])
@pytest.mark.parametrize("name", ["net", "tied", "params", "extra", "deep"])
def test_copies_keep_structure_state_and_sharing_like_torch(copier, name):
    t, j = build(name)
    tc, jc = copier(t), copier(j)
    assert repr(jc) == repr(tc) == repr(t)
    assert_same_state(tc, jc)
    for method in ("named_parameters", "named_buffers", "named_modules"):
        assert _identity_groups(jc, method) == _identity_groups(tc, method)
    assert all(a is not b for a, b in zip(j.parameters(), jc.parameters()))
    assert [p.requires_grad for p in jc.parameters()] == [p.requires_grad for p in tc.parameters()]
    if name == "extra":
        assert jc.state_dict()["_extra_state"] == tc.state_dict()["_extra_state"]


@pytest.mark.torch
@pytest.mark.parametrize("copier", [copy.deepcopy, _pickle_copy], ids=["deepcopy", "pickle"])
def test_copy_is_independent_of_original(copier):
    results = []
    for s in SIDES:
        m = cls(s, "Tied")()
        c = copier(m)
        with torch.no_grad():
            c.enc.weight.data = s.arr(np.zeros((3, 3)))
        results.append(
            (
                float(to_numpy(m.enc.weight).sum()) != 0.0,
                float(to_numpy(c.dec.weight).sum()) == 0.0,
                c.dec.weight is c.enc.weight,
                c.seq[0] is c.a is c.b,
            )
        )
    assert results[0] == (True, True, True, True)
    assert results[1] == results[0]


def double_output(module, args, output):  # module level so pickle can find it
    return output * 2


@pytest.mark.torch
@pytest.mark.parametrize("copier", [copy.deepcopy, _pickle_copy], ids=["deepcopy", "pickle"])
def test_copies_keep_hooks_and_training_mode(copier):
    t, j = build("mlp")
    outs = []
    for m, x in zip((t, j), inputs(2, 4)):
        m.eval()
        m[0].register_forward_hook(double_output)
        c = copier(m)
        assert not c.training and not c[0].training
        with torch.no_grad():
            outs.append(to_numpy(c(x)))
            assert len(c[0]._forward_hooks) == 1
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-6)


@pytest.mark.torch
@pytest.mark.parametrize("copier", [copy.deepcopy, _pickle_copy], ids=["deepcopy", "pickle"])
def test_compiled_module_still_works_after_copy(copier):
    t, j = build("net")
    t.eval()
    j.eval()
    j.compile()
    xt, xj = inputs(3, 4)
    expected = to_numpy(t(xt).detach())
    np.testing.assert_allclose(to_numpy(j(xj)), expected, rtol=1e-5, atol=1e-5)
    c = copier(j)
    assert c._compiled is not None
    np.testing.assert_allclose(to_numpy(c(xj)), expected, rtol=1e-5, atol=1e-5)
    # the copy's program reads the copy's state; the original is untouched
    c.scale.data = jnp.zeros(2)
    with torch.no_grad():
        t.scale.zero_()
    np.testing.assert_allclose(to_numpy(c(xj)), to_numpy(t(xt)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(j(xj)), expected, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ layers against torch


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", FORWARD_TREES)
def test_forward_in_eval_matches_torch(name):
    t, j = build(name)
    t.eval()
    j.eval()
    out_t, out_j = run_forward(name, t, j)
    np.testing.assert_allclose(out_j, out_t, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name", ["bn", "bn_cumulative", "bn_untracked", "net", "linear", "tied"])
def test_training_steps_match_torch_outputs_and_running_stats(name):
    t, j = build(name)
    for step in range(4):
        out_t, out_j = run_forward(name, t, j, n=6, seed=10 + step)
        np.testing.assert_allclose(out_j, out_t, rtol=1e-4, atol=1e-5)
    assert_same_state(t, j, rtol=1e-5, atol=1e-6)
    t.eval()
    j.eval()
    out_t, out_j = run_forward(name, t, j, seed=99)
    np.testing.assert_allclose(out_j, out_t, rtol=1e-4, atol=1e-5)


@pytest.mark.torch
def test_batchnorm_counts_batches_and_cumulative_average_like_torch():
    t, j = build("bn_cumulative")
    batches = [inputs(4 + k, 3, seed=k) for k in range(5)]
    for xt, xj in batches:
        t(xt)
        j(xj)
    assert int(j.num_batches_tracked) == int(t.num_batches_tracked)
    # momentum=None: the running mean is the plain average of the batch means
    mean_of_means = np.mean([to_numpy(xt).mean(0) for xt, _ in batches], axis=0)
    np.testing.assert_allclose(to_numpy(t.running_mean), mean_of_means, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(to_numpy(j.running_mean), to_numpy(t.running_mean), rtol=1e-5)
    np.testing.assert_allclose(to_numpy(j.running_var), to_numpy(t.running_var), rtol=1e-5)


@pytest.mark.torch
def test_batchnorm_three_dimensional_input_matches_torch():
    t, j = build("bn")
    x = np.random.default_rng(3).standard_normal((4, 3, 5)).astype(np.float32)
    for _ in range(2):
        out_t = t(torch.from_numpy(x))
        out_j = j(jnp.asarray(x))
        np.testing.assert_allclose(to_numpy(out_j), to_numpy(out_t), rtol=1e-4, atol=1e-5)
    assert_same_state(t, j, rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_batchnorm_rejects_wrong_rank_like_torch():
    t, j = outcomes(lambda s: s.nn.BatchNorm1d(3)(s.arr(np.ones((2, 3, 4, 5)))))
    assert t == ("raise", "ValueError", "expected 2D or 3D input (got 4D input)")
    assert j == t


@pytest.mark.torch
def test_default_init_has_torchs_state_layout_and_distributions():
    for make in (
        lambda s: s.nn.Linear(64, 32),
        lambda s: s.nn.BatchNorm1d(5),
        lambda s: s.nn.BatchNorm1d(5, affine=False, track_running_stats=False),
    ):
        t, j = make(TORCH), make(JM)
        ts, js = t.state_dict(), j.state_dict()
        assert [(k, tuple(v.shape)) for k, v in js.items()] == [
            (k, tuple(v.shape)) for k, v in ts.items()
        ]
        assert [canon(v)[2] for v in js.values()] == [canon(v)[2] for v in ts.values()]
    t, j = nn.BatchNorm1d(5), torch.nn.BatchNorm1d(5)
    assert canon(dict(t.state_dict())) == canon(dict(j.state_dict()))
    lin = nn.Linear(64, 32)
    # torch's kaiming_uniform_(a=sqrt(5)) bound, which is also its bias bound 1/sqrt(fan_in)
    bound = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5)) * math.sqrt(3 / 64)
    ref = torch.nn.Linear(64, 32)
    for p in (ref.weight, ref.bias):
        assert float(p.detach().abs().max()) <= bound
    for p in (lin.weight, lin.bias):
        values = to_numpy(p)
        assert np.abs(values).max() <= bound
        assert np.abs(values).max() > 0.8 * bound  # spread over the interval, not all zero
        assert abs(values.mean()) < 0.25 * bound


DTYPE_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}
DTYPE_LAYERS = {
    "linear": lambda s, dt: s.nn.Linear(3, 4, dtype=dt),
    "linear_nobias": lambda s, dt: s.nn.Linear(3, 2, bias=False, dtype=dt),
    "bn": lambda s, dt: s.nn.BatchNorm1d(3, dtype=dt),
    "bn_cumulative": lambda s, dt: s.nn.BatchNorm1d(3, momentum=None, dtype=dt),
}


@pytest.mark.torch
@pytest.mark.parametrize("dtype", list(DTYPE_TOL))
@pytest.mark.parametrize("layer", list(DTYPE_LAYERS))
def test_layers_match_torch_per_dtype(layer, dtype):
    t, j = (DTYPE_LAYERS[layer](s, s.dtype(dtype)) for s in (TORCH, JM))
    j.load_state_dict(t.state_dict())
    tol = DTYPE_TOL[dtype]
    assert [canon(v)[2] for v in j.state_dict().values()] == [
        canon(v)[2] for v in t.state_dict().values()
    ]
    for step in range(3):
        xt, xj = inputs(6, 3, seed=step)
        xt, xj = TORCH.cast(xt, dtype), JM.cast(xj, dtype)
        with torch.no_grad():
            out_t = t(xt)
        out_j = j(xj)
        assert dtype_name(out_j) == dtype_name(out_t) == dtype
        np.testing.assert_allclose(to_numpy(out_j), to_numpy(out_t), rtol=tol, atol=tol)
        t.eval() if step == 1 else t.train()
        j.eval() if step == 1 else j.train()
    assert_same_state(t, j, rtol=tol, atol=tol)


@pytest.mark.torch
@pytest.mark.parametrize("shape", [(3,), (2, 5, 3)])
def test_linear_accepts_any_leading_shape_like_torch(shape):
    t, j = build("linear")
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out_t = t(torch.from_numpy(x)).detach()
    np.testing.assert_allclose(to_numpy(j(jnp.asarray(x))), to_numpy(out_t), rtol=1e-5, atol=1e-6)


@pytest.mark.torch
def test_dropout_matches_torch_where_deterministic():
    x = np.random.default_rng(0).standard_normal((50, 40)).astype(np.float32)
    for p in (0.0, 0.3, 1.0):
        for training in (True, False):
            t, j = torch.nn.Dropout(p), nn.Dropout(p)
            t.train(training)
            j.train(training)
            out_t, out_j = to_numpy(t(torch.from_numpy(x))), to_numpy(j(jnp.asarray(x)))
            if p in (0.0, 1.0) or not training:
                np.testing.assert_allclose(out_j, out_t, rtol=1e-6)
            else:  # each element is zeroed or scaled by 1/(1-p), in both
                scaled = np.isclose(out_j, x / (1 - p), rtol=1e-5)
                assert np.all(scaled | (out_j == 0))
                assert abs((out_j == 0).mean() - p) < 0.05
                assert abs((out_t == 0).mean() - p) < 0.05


def test_dropout_draws_fresh_masks_and_repeats_after_reseeding():
    x = jnp.ones((8, 8))
    d = nn.Dropout(0.5)
    jm.manual_seed(3)
    a, b = d(x), d(x)
    jm.manual_seed(3)
    assert not np.array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(d(x)), np.asarray(a))


@pytest.mark.torch
@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_dropout_rejects_bad_probability_like_torch(p):
    t, j = outcomes(lambda s: s.nn.Dropout(p))
    assert t[:2] == ("raise", "ValueError")
    assert j == t


@pytest.mark.torch
def test_identity_and_relu_match_torch():
    def run(s):
        x = s.arr([[-1.0, 0.0, 2.5]])
        return s.nn.ReLU()(x), s.nn.ReLU(inplace=True)(s.arr([-3.0, 3.0])), s.nn.Identity(7)(x)

    t, j = outcomes(run)
    assert j == t
