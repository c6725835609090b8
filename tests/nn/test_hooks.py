"""Forward hooks and RemovableHandle against live PyTorch.

Every scenario runs the same script on torch and on jmodule and compares the
event log: which hook ran, in what order, with which arguments, and what the
call returned or raised. The modules compute on plain Python numbers (the
``Add`` module) so the logs are exact.
"""

import copy
import warnings

import pytest
from torch_ref import SIDES, cls, outcomes

import jmodule as jm
from jmodule import nn


def _add(s):
    return cls(s, "Add")()


def _logger(log, tag, result=None, with_kwargs=False, kind="pre"):
    """A hook that records its arguments and returns ``result``."""
    if kind == "pre" and not with_kwargs:
        return lambda m, args: (log.append((tag, args)), result)[1]
    if kind == "pre":
        return lambda m, args, kwargs: (log.append((tag, args, dict(kwargs))), result)[1]
    if not with_kwargs:
        return lambda m, args, out: (log.append((tag, args, out)), result)[1]
    return lambda m, args, kwargs, out: (log.append((tag, args, dict(kwargs), out)), result)[1]


# ------------------------------------------------------------------ order


@pytest.mark.torch
def test_hook_order_with_prepend_matches_torch():
    def run(s):
        log = []
        m = _add(s)
        m.register_forward_pre_hook(_logger(log, "pre1"))
        m.register_forward_pre_hook(_logger(log, "pre2"))
        m.register_forward_pre_hook(
            _logger(log, "pre0", with_kwargs=True), prepend=True, with_kwargs=True
        )
        m.register_forward_pre_hook(_logger(log, "pre-first"), prepend=True)
        m.register_forward_hook(_logger(log, "fwd1", kind="fwd"))
        m.register_forward_hook(
            _logger(log, "fwd0", kind="fwd", with_kwargs=True), prepend=True, with_kwargs=True
        )
        m.register_forward_hook(_logger(log, "fwd2", kind="fwd"), always_call=True)
        log.append(("result", m(1, y=2)))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok", t
    assert [e[0] for e in t[1]] == [
        "pre-first",
        "pre0",
        "pre1",
        "pre2",
        "fwd0",
        "fwd1",
        "fwd2",
        "result",
    ]
    assert j == t


@pytest.mark.torch
def test_global_hooks_fire_before_module_hooks_for_every_module():
    def run(s):
        log = []
        seq = s.nn.Sequential(_add(s), s.nn.Sequential(_add(s)))
        names = {id(m): k or "root" for k, m in seq.named_modules()}
        seq[0].register_forward_pre_hook(_logger(log, "local-pre"), prepend=True)
        seq[0].register_forward_hook(_logger(log, "local-fwd", kind="fwd"), prepend=True)
        hooks = [
            s.nn.modules.module.register_module_forward_pre_hook(
                lambda m, args: log.append(("global-pre", names[id(m)], args))
            ),
            s.nn.modules.module.register_module_forward_hook(
                lambda m, args, out: log.append(("global-fwd", names[id(m)], out))
            ),
            s.nn.modules.module.register_module_forward_hook(
                lambda m, args, kwargs, out: log.append(("global-kw", names[id(m)], kwargs)),
                with_kwargs=True,
            ),
        ]
        try:
            log.append(("result", seq(5)))
        finally:
            for h in hooks:
                h.remove()
        log.append(("after removal", seq(6)))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


def test_global_hooks_are_exported_from_nn():
    assert nn.register_module_forward_hook is nn.modules.module.register_module_forward_hook
    assert nn.register_module_forward_pre_hook is nn.modules.module.register_module_forward_pre_hook


@pytest.mark.torch
def test_nested_modules_hooks_order_matches_torch():
    def run(s):
        log = []
        tree = s.nn.Sequential(_add(s), s.nn.Sequential(_add(s), _add(s)), _add(s))
        for name, m in tree.named_modules():
            m.register_forward_pre_hook(lambda mod, args, n=name: log.append(("pre", n, args)))
            m.register_forward_hook(lambda mod, args, out, n=name: log.append(("fwd", n, out)))
        log.append(tree(1))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


def test_hook_receives_the_module_itself():
    m = jm.nn.Identity()
    seen = []
    m.register_forward_pre_hook(lambda mod, args: seen.append(mod))
    m.register_forward_hook(lambda mod, args, out: seen.append(mod))
    m(1)
    assert seen == [m, m] and all(s is m for s in seen)


# ------------------------------------------------------------------ replacement rules

PRE_RETURNS = {
    "none": None,
    "scalar": 10,
    "tuple": (20, 3),
    "one-tuple": (30,),
    "list": [40],
}


@pytest.mark.torch
@pytest.mark.parametrize("ret", list(PRE_RETURNS))
def test_pre_hook_return_replaces_args_like_torch(ret):
    def run(s):
        log = []
        m = _add(s)
        m.register_forward_pre_hook(_logger(log, "pre", PRE_RETURNS[ret]))
        m.register_forward_pre_hook(_logger(log, "seen"))
        m.register_forward_hook(_logger(log, "fwd", kind="fwd"))
        if ret == "tuple":
            log.append(m(1))  # the hook supplies y positionally
        else:
            log.append(m(1, y=[2] if ret == "list" else 2))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


WITH_KWARGS_RETURNS = {
    "none": None,
    "args-kwargs": ((7,), {"y": 100}),
    "args-only-empty-kwargs": ((8, 1), {}),
    "bad-single": "bad",
    "bad-triple": ((1,), {}, 3),
}


@pytest.mark.torch
@pytest.mark.parametrize("ret", list(WITH_KWARGS_RETURNS))
def test_pre_hook_with_kwargs_replaces_args_and_kwargs_like_torch(ret):
    def run(s):
        log = []
        m = _add(s)
        m.register_forward_pre_hook(
            _logger(log, "pre", WITH_KWARGS_RETURNS[ret], with_kwargs=True), with_kwargs=True
        )
        m.register_forward_hook(_logger(log, "fwd", kind="fwd", with_kwargs=True), with_kwargs=True)
        log.append(m(1, y=2))
        return log

    t, j = outcomes(run)
    assert j == t
    assert t[:2] == ("raise", "RuntimeError") if ret.startswith("bad") else t[0] == "ok"


@pytest.mark.torch
def test_forward_hooks_chain_replacements_like_torch():
    def run(s):
        log = []
        m = _add(s)
        m.register_forward_hook(_logger(log, "a", 100, kind="fwd"))
        m.register_forward_hook(_logger(log, "b", None, kind="fwd"))
        m.register_forward_hook(
            _logger(log, "c", (1, 2), kind="fwd", with_kwargs=True), with_kwargs=True
        )
        m.register_forward_hook(_logger(log, "d", None, kind="fwd"))
        log.append(m(3, y=4))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_kwargs_reach_forward_but_not_plain_hooks():
    def run(s):
        log = []
        m = _add(s)
        m.register_forward_pre_hook(_logger(log, "pre"))
        m.register_forward_hook(_logger(log, "fwd", kind="fwd"))
        log.append(m(x=1, y=2))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


# ------------------------------------------------------------------ always_call


def _always_call_scenario(s, failing):
    log = []
    m = cls(s, "Boom")() if failing == "forward" else _add(s)
    if failing == "pre-hook":
        m.register_forward_pre_hook(lambda mod, args: 1 / 0)
    m.register_forward_hook(_logger(log, "plain", kind="fwd"))
    m.register_forward_hook(_logger(log, "always", kind="fwd"), always_call=True)
    if failing == "forward-hook":
        m.register_forward_hook(lambda mod, args, out: [][1])
    m.register_forward_hook(
        _logger(log, "always-kw", kind="fwd", with_kwargs=True), with_kwargs=True, always_call=True
    )
    m.register_forward_hook(_logger(log, "plain-last", kind="fwd"))
    try:
        log.append(("result", m(2, y=1) if failing != "forward" else m(2)))
    except Exception as e:
        log.append(("raised", type(e).__name__, str(e)))
    return log


@pytest.mark.torch
@pytest.mark.parametrize("failing", ["none", "forward", "pre-hook", "forward-hook"])
def test_always_call_hooks_run_when_the_call_raises_like_torch(failing):
    t, j = outcomes(lambda s: _always_call_scenario(s, failing))
    assert t[0] == "ok"
    assert j == t
    if failing != "none":
        tags = [e[0] for e in t[1]]
        assert "always" in tags and "plain-last" not in tags and tags[-1] == "raised"


@pytest.mark.torch
def test_failing_always_call_hook_is_silenced_with_a_warning_like_torch():
    def run(s):
        m = cls(s, "Boom")()
        m.register_forward_hook(lambda mod, args, out: {}["missing"], always_call=True)
        m.register_forward_hook(lambda mod, args, out: log.append("second"), always_call=True)
        log = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                m(1)
            except ValueError as e:
                log.append(str(e))
        return log, [(w.category.__name__, str(w.message)) for w in caught]

    t, j = outcomes(run)
    assert t[1][1][0][1].startswith("module forward hook with ``always_call=True`` raised")
    assert j == t


@pytest.mark.torch
def test_global_always_call_hook_runs_when_forward_raises():
    def run(s):
        log = []
        with s.nn.modules.module.register_module_forward_hook(
            lambda m, args, out: log.append(("global", args, out)), always_call=True
        ):
            try:
                cls(s, "Boom")()(4)
            except ValueError as e:
                log.append(str(e))
            log.append(_add(s)(1, y=1))
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


# ------------------------------------------------------------------ RemovableHandle


@pytest.mark.torch
def test_removable_handle_remove_and_context_manager_match_torch():
    def run(s):
        log = []
        m = _add(s)
        h1 = m.register_forward_pre_hook(_logger(log, "h1", with_kwargs=True), with_kwargs=True)
        h2 = m.register_forward_hook(
            _logger(log, "h2", kind="fwd", with_kwargs=True), with_kwargs=True, always_call=True
        )
        h3 = m.register_forward_hook(_logger(log, "h3", kind="fwd"))
        ids_increase = h1.id < h2.id < h3.id
        m(1)
        h2.remove()
        h2.remove()  # a second remove does nothing
        sizes = (
            len(m._forward_hooks),
            len(m._forward_hooks_with_kwargs),
            len(m._forward_hooks_always_called),
        )
        m(2)
        with m.register_forward_hook(_logger(log, "ctx", 50, kind="fwd")) as h:
            inside = (m(3), isinstance(h, type(h1)))
        outside = m(4)
        h1.remove()
        h3.remove()
        empty = (len(m._forward_pre_hooks), len(m._forward_pre_hooks_with_kwargs))
        return log, ids_increase, sizes, inside, outside, empty, m(5)

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


def test_removable_handle_is_exported_and_survives_module_deletion():
    m = nn.Identity()
    h = m.register_forward_hook(lambda *a: None)
    assert isinstance(h, nn.RemovableHandle)
    del m
    h.remove()  # the hooks dict is gone: nothing to do, no error


@pytest.mark.torch
def test_hooks_survive_deepcopy_and_see_the_copy():
    for s in SIDES:
        m = _add(s)
        seen = []
        m.register_forward_pre_hook(lambda mod, args: seen.append(mod) or (args[0] * 10,))
        c = copy.deepcopy(m)
        assert c(1) == 10
        assert seen[-1] is c
        assert m(2) == 20
        assert seen[-1] is m
