"""state_dict / load_state_dict, their hooks and extra state against live PyTorch.

Where jmodule promises more than PyTorch (a failed load leaves the module
unchanged; PyTorch may have copied some tensors before raising), the test
compares against the module's own state before the call.
"""

import warnings
from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _torch import torch
from torch_ref import (
    JM,
    SIDES,
    TORCH,
    TREES,
    assert_same_state,
    build,
    canon,
    cls,
    normalize,
    outcome,
    outcomes,
    state_of,
    to_numpy,
)

from jmodule import nn

TREE_NAMES = sorted(TREES)


def _is_extra(key):
    return key.split(".")[-1] == "_extra_state"


def _np_state(sd):
    """Arrays as numpy; extra state as it is."""
    return {k: v if _is_extra(k) else to_numpy(v) for k, v in sd.items()}


def _as_torch(sd):
    return {k: v if _is_extra(k) else torch.from_numpy(np.array(v)) for k, v in sd.items()}


def _identity_groups(m):
    groups = {}
    for k, v in m.named_buffers(remove_duplicate=False):
        groups.setdefault(id(v), []).append(k)
    for k, v in m.named_parameters(remove_duplicate=False):
        groups.setdefault(id(v), []).append(k)
    return sorted(groups.values())


def _snapshot(m):
    """Values and object identities of everything a load could change."""
    params = [(k, id(p)) for k, p in m.named_parameters(remove_duplicate=False)]
    buffers = [(k, id(b)) for k, b in m.named_buffers(remove_duplicate=False)]
    return state_of(m), params, buffers


def _assert_unchanged(m, snap):
    values, params, buffers = _snapshot(m)
    assert params == snap[1] and buffers == snap[2]
    assert list(values) == list(snap[0])
    for k in values:
        np.testing.assert_array_equal(values[k], snap[0][k], err_msg=k)


# ------------------------------------------------------------------ saving


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_state_dict_keys_order_values_and_metadata_match_torch(name):
    t, j = build(name)
    ts, js = t.state_dict(), j.state_dict()
    assert list(js) == list(ts)
    assert canon(dict(js)) == canon(dict(ts))
    assert dict(js._metadata) == dict(ts._metadata)
    assert type(js) is type(ts) is OrderedDict
    assert all(isinstance(v, jax.Array) for k, v in js.items() if not k.endswith("_extra_state"))


@pytest.mark.torch
@pytest.mark.parametrize("name", ["net", "tied", "params", "bn"])
def test_keep_vars_returns_the_parameters_themselves(name):
    t, j = build(name)
    ts, js = t.state_dict(keep_vars=True), j.state_dict(keep_vars=True)
    assert canon(dict(js)) == canon(dict(ts))
    params = dict(j.named_parameters(remove_duplicate=False))
    for k, v in js.items():
        if k in params:
            assert v is params[k]
    assert not any(isinstance(v, nn.Parameter) for v in j.state_dict().values())


@pytest.mark.torch
def test_prefix_and_destination_match_torch():
    def run(s):
        m = cls(s, "Net")()
        with_prefix = m.state_dict(prefix="model.")
        plain = {}
        same = m.state_dict(destination=plain, prefix="p.") is plain
        ordered = OrderedDict(keep=1)
        ordered._metadata = OrderedDict(old={"version": 0})
        m.blocks.state_dict(destination=ordered, prefix="blocks.")
        return (
            list(with_prefix),
            dict(with_prefix._metadata),
            same,
            list(plain),
            hasattr(plain, "_metadata"),
            list(ordered),
            dict(ordered._metadata),
        )

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_positional_arguments_warn_like_torch():
    caught = []
    for s in SIDES:
        m = cls(s, "Extra")()
        dest = {}
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = m.state_dict(dest, "pre.")
        caught.append((w[0].category, str(w[0].message).split(" Refer")[0], out is dest, list(out)))
    assert caught[0][0] is FutureWarning
    assert caught[1] == caught[0]


@pytest.mark.torch
def test_non_persistent_and_none_entries_are_left_out_like_torch():
    def run(s):
        m = s.nn.Module()
        m.a = s.nn.Buffer(s.arr([1.0]), persistent=False)
        m.b = s.nn.Buffer(s.arr([2.0]))
        m.register_buffer("c", s.arr([3.0]), persistent=False)
        m.register_buffer("d", None)
        m.register_parameter("e", None)
        m.add_module("f", None)
        m.g = s.param([4.0])
        return (
            list(m.state_dict()),
            [k for k, _ in m.named_buffers()],
            m.load_state_dict(
                {"b": s.arr([5.0]), "g": s.arr([6.0]), "a": s.arr([0.0])}, strict=False
            ),
        )

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


# ------------------------------------------------------------------ loading


@pytest.mark.torch
@pytest.mark.parametrize("name", TREE_NAMES)
def test_load_round_trips_between_frameworks(name):
    t, j = build(name)  # torch -> jmodule (torch tensors)
    assert_same_state(t, j)
    j2 = TREES[name](JM)
    j2.load_state_dict(_np_state(j.state_dict()))  # numpy arrays
    assert_same_state(t, j2)
    j3 = TREES[name](JM)
    out = j3.load_state_dict(j.state_dict())  # jax arrays (extra state included)
    assert repr(out) == "<All keys matched successfully>"
    assert_same_state(t, j3)
    t2 = TREES[name](TORCH)
    t2.load_state_dict(_as_torch(j.state_dict()))  # jmodule -> torch
    assert_same_state(t2, j)


@pytest.mark.torch
def test_loading_keeps_parameter_identity_dtype_and_shared_buffers():
    t, j = build("tied")
    before = [(k, id(p)) for k, p in j.named_parameters(remove_duplicate=False)]
    j.load_state_dict(_np_state(cls(TORCH, "Tied")().state_dict()))
    assert [(k, id(p)) for k, p in j.named_parameters(remove_duplicate=False)] == before
    assert _identity_groups(j) == _identity_groups(t)
    assert all(p.dtype == jnp.float32 for p in j.parameters())


@pytest.mark.torch
def test_load_converts_numpy_float64_and_torch_int64_to_the_module_dtypes():
    t, j = build("bn")
    sd = {k: np.asarray(to_numpy(v), dtype=np.float64) for k, v in t.state_dict().items()}
    sd["num_batches_tracked"] = torch.tensor(7)
    j.load_state_dict(sd)
    assert j.weight.dtype == jnp.float32 and j.running_var.dtype == jnp.float32
    assert j.num_batches_tracked.dtype == jnp.int32 and int(j.num_batches_tracked) == 7


@pytest.mark.torch
def test_loading_pytorch_weights_on_the_cpu_compiles_nothing_and_copies():
    from _monitoring import LOWER, counting
    from shared_models import resnet18

    torch.manual_seed(0)
    tm, jm_model = resnet18(torch.nn), resnet18(nn)
    with torch.no_grad():
        for b in tm.buffers():
            if b.dtype == torch.float32:
                b.uniform_(0.5, 1.5)  # running statistics unlike the fresh model's
    sd = tm.state_dict()
    committed = jm_model.fc.weight
    committed.data = jax.device_put(committed.data, jax.devices("cpu")[0])
    with counting(LOWER) as seen:
        jm_model.load_state_dict(sd)  # torch tensors
        again = resnet18(nn)
        again.load_state_dict(jm_model.state_dict())  # jax arrays
        half = resnet18(nn).to(jnp.bfloat16)
        half.load_state_dict({k: v.numpy() for k, v in sd.items()})  # float32 into bfloat16
    assert seen == []
    for k, v in sd.items():
        want = v.numpy()
        for model in (jm_model, again):
            got = model.state_dict()[k]
            assert got.dtype == (jnp.int32 if want.dtype == np.int64 else want.dtype), k
            np.testing.assert_array_equal(got, want, err_msg=k)
        if want.dtype == np.float32:
            np.testing.assert_array_equal(
                half.state_dict()[k], jnp.asarray(want).astype(jnp.bfloat16), err_msg=k
            )
    assert jm_model.fc.weight.data.committed and not jm_model.fc.bias.data.committed
    # copies, as PyTorch's copy_: the checkpoint's memory is not the model's
    fc = np.array(jm_model.fc.weight)
    with torch.no_grad():
        tm.fc.weight.add_(1.0)
    np.testing.assert_array_equal(jm_model.fc.weight, fc)
    assert again.fc.weight.data is not jm_model.fc.weight.data


@pytest.mark.torch
def test_bfloat16_torch_tensors_load_like_torch():
    def run(s, assign):
        m = s.nn.Linear(3, 2)
        m.bias.requires_grad_(False)
        src = torch.nn.Linear(3, 2).to(torch.bfloat16)
        src.weight.data = torch.linspace(-1, 1, 6).reshape(2, 3).to(torch.bfloat16)
        src.bias.data = torch.tensor([0.1, 0.2]).to(torch.bfloat16)
        m.load_state_dict(src.state_dict(), assign=assign)
        return [(k, canon(p), p.requires_grad) for k, p in m.named_parameters()]

    for assign in (False, True):
        t, j = outcomes(lambda s, a=assign: run(s, a))
        assert t[0] == "ok"
        assert j == t


@pytest.mark.torch
def test_assign_replaces_the_objects_and_keeps_requires_grad_like_torch():
    def run(s):
        m = cls(s, "Net")()
        m.stem.weight.requires_grad_(False)
        old = {k: p for k, p in m.named_parameters()}
        old_buf = m.offset
        src = cls(s, "Net")().state_dict()
        m.load_state_dict(src, assign=True)
        return (
            [(k, p is not old[k], p.requires_grad) for k, p in m.named_parameters()],
            m.offset is not old_buf,
            canon(m.state_dict()) == canon(src),
        )

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


def test_assign_keeps_a_given_parameter_object():
    m = nn.Linear(2, 2)
    m.weight.requires_grad_(False)
    given = nn.Parameter(jnp.ones((2, 2)))
    m.load_state_dict({"weight": given, "bias": jnp.zeros(2)}, assign=True)
    assert m.weight is given and not given.requires_grad


@pytest.mark.torch
def test_scalar_from_one_element_checkpoint_like_torch():
    def run(s):
        m = s.nn.BatchNorm1d(2)
        sd = m.state_dict()
        sd["num_batches_tracked"] = s.arr([5], dtype="int64")
        m.load_state_dict(sd)
        return tuple(m.num_batches_tracked.shape), int(m.num_batches_tracked)

    t, j = outcomes(run)
    assert t == ("ok", ((), 5))
    assert j == t


def _broken_state(s):
    """A Net state dict with two missing keys, two unexpected keys and two size mismatches."""
    sd = cls(s, "Net")().state_dict()
    for i, (k, v) in enumerate(sd.items()):  # the same values in both frameworks
        dtype = "int64" if "int" in str(v.dtype) else "float32"
        sd[k] = s.arr(np.arange(i, i + np.prod(v.shape)).reshape(tuple(v.shape)), dtype)
    del sd["stem.bias"], sd["blocks.1.1.running_mean"]
    sd["extra.key"] = s.arr([1.0])
    sd["blocks.0.0.bogus"] = s.arr([1.0])
    sd["heads.cls.weight"] = s.arr(np.ones((2, 7)))
    sd["scale"] = s.arr(np.ones(3))
    return sd


@pytest.mark.torch
@pytest.mark.parametrize("strict", [True, False])
def test_failed_load_lists_every_problem_like_torch_and_changes_nothing(strict):
    snaps = {}

    def run(s):
        m = cls(s, "Net")()
        snaps[s.name] = (m, _snapshot(m))
        return m.load_state_dict(_broken_state(s), strict=strict)

    t, j = outcomes(run)
    assert t[:2] == ("raise", "RuntimeError")
    assert j == t
    for key in ("size mismatch for heads.cls.weight", "(2, 7)", "(2, 6)", "scale"):
        assert key in j[2]
    if strict:
        assert '"stem.bias", "blocks.1.1.running_mean"' in j[2]
        assert '"extra.key", "blocks.0.0.bogus"' in j[2]
    _assert_unchanged(*snaps["jm"])


def test_size_mismatch_message_has_key_and_both_shapes():
    m = nn.Linear(4, 10)
    with pytest.raises(
        RuntimeError,
        match=r"Error\(s\) in loading state_dict for Linear:\n\tsize mismatch for weight: copying "
        r"a param with shape \(10, 5\) from checkpoint, the shape in current model is \(10, 4\)\.",
    ):
        m.load_state_dict({"weight": np.zeros((10, 5)), "bias": np.zeros(10)})


@pytest.mark.torch
def test_non_strict_load_returns_incompatible_keys_like_torch():
    def run(s):
        m = cls(s, "Net")()
        sd = _broken_state(s)
        del sd["heads.cls.weight"], sd["scale"]
        out = m.load_state_dict(sd, strict=False)
        loaded = {k: v for k, v in m.state_dict().items() if k in sd}
        return repr(out), str(out), out.missing_keys, out.unexpected_keys, tuple(out), loaded

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_all_keys_matched_repr_and_incompatible_keys_type():
    t, j = build("net")
    for m in (t, j):
        out = m.load_state_dict(m.state_dict())
        assert repr(out) == str(out) == "<All keys matched successfully>"
        assert out == ([], [])
        assert out.missing_keys == [] and out.unexpected_keys == []
    assert type(j.load_state_dict(j.state_dict())) is nn.IncompatibleKeys


@pytest.mark.torch
def test_load_rejects_non_mappings_and_non_arrays():
    t, j = outcomes(lambda s: s.nn.Linear(1, 1).load_state_dict([("weight", 1)]))
    assert t[:2] == ("raise", "TypeError")
    assert j == t
    t, j = outcomes(lambda s: s.nn.Linear(1, 1).load_state_dict({"weight": "x", "bias": 1.0}))
    assert t[:2] == j[:2] == ("raise", "RuntimeError")
    for key in ("weight", "bias"):
        assert f'While copying the parameter named "{key}"' in j[2]
    assert "<class 'str'>" in j[2] and "<class 'float'>" in j[2]


@pytest.mark.torch
def test_unexpected_keys_for_non_persistent_buffers_like_torch():
    t, j = outcomes(
        lambda s: cls(s, "Net")().load_state_dict(
            {**cls(s, "Net")().state_dict(), "cache": s.arr([0.0, 0.0])}
        )
    )
    assert t[:2] == ("raise", "RuntimeError")
    assert j == t


@pytest.mark.torch
def test_failure_inside_a_hook_changes_nothing():
    j = cls(JM, "Net")()
    snap = _snapshot(j)

    def fail(module, *args):
        raise KeyError("from hook")

    j.blocks[2].register_load_state_dict_pre_hook(fail)
    sd = {k: np.asarray(v) + 1 for k, v in _np_state(cls(JM, "Net")().state_dict()).items()}
    with pytest.raises(KeyError, match="from hook"):
        j.load_state_dict(sd)
    _assert_unchanged(j, snap)


# ------------------------------------------------------------------ extra state


@pytest.mark.torch
def test_extra_state_saved_and_loaded_like_torch():
    def run(s):
        m = s.nn.Sequential(cls(s, "Extra")(), s.nn.Linear(2, 2))
        sd = m.state_dict()
        sd["0._extra_state"] = {"epoch": 9}
        out = m.load_state_dict(sd)
        missing = dict(sd)
        del missing["0._extra_state"]
        err = outcome(lambda: m.load_state_dict(missing))
        lenient = m.load_state_dict(missing, strict=False)
        unexpected = outcome(lambda: m.load_state_dict({**sd, "1._extra_state": 1}))
        return list(sd), repr(out), m[0].note, err, repr(lenient), unexpected

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_only_set_extra_state_overridden_is_expected_on_load_only():
    def run(s):
        class Taker(s.nn.Module):
            def set_extra_state(self, state):
                self.got = state

        m = Taker()
        return (
            list(m.state_dict()),
            repr(m.load_state_dict({}, strict=False)),
            outcome(lambda: m.load_state_dict({"_extra_state": 3}) and m.got),
        )

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_base_extra_state_methods_raise():
    for s in SIDES:
        m = s.nn.Module()
        with pytest.raises(RuntimeError, match=r"Reached a code path in Module.get_extra_state"):
            m.get_extra_state()
        with pytest.raises(RuntimeError, match=r"Reached a code path in Module.set_extra_state"):
            m.set_extra_state({})


@pytest.mark.torch
def test_failed_load_restores_extra_state():
    m = cls(JM, "Extra")()
    sd = m.state_dict()
    sd["_extra_state"] = {"epoch": 100}
    sd["fc.weight"] = np.zeros((3, 3))
    with pytest.raises(RuntimeError, match=r"size mismatch for fc.weight"):
        m.load_state_dict(sd)
    assert m.note == {"epoch": 3}


# ------------------------------------------------------------------ hooks


@pytest.mark.torch
def test_state_dict_hooks_match_torch():
    def run(s):
        log = []
        m = cls(s, "Net")()
        for name, sub in m.named_modules():
            sub.register_state_dict_pre_hook(
                lambda mod, prefix, keep_vars, n=name: log.append(("pre", n, prefix, keep_vars))
            )
            sub.register_state_dict_post_hook(
                lambda mod, sd, prefix, meta, n=name: log.append(("post", n, prefix, meta, len(sd)))
            )

        def add_key(mod, sd, prefix, meta):
            sd[prefix + "added"] = s.arr([1.0])

        h = m.blocks[0].register_state_dict_post_hook(add_key)
        keys = list(m.state_dict(keep_vars=True))
        h.remove()
        return log, keys, list(m.state_dict(prefix="x."))

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_state_dict_post_hook_must_return_none_like_torch():
    def run(s):
        m = s.nn.Linear(1, 1)
        m.register_state_dict_post_hook(lambda mod, sd, prefix, meta: {})
        return m.state_dict()

    t, j = outcomes(run)
    assert t == ("raise", "RuntimeError", "state_dict post-hook must return None")
    assert j == t


@pytest.mark.torch
def test_load_state_dict_pre_hooks_see_torchs_arguments():
    def run(s):
        log = []
        m = cls(s, "Net")()
        for name, sub in m.named_modules():
            sub.register_load_state_dict_pre_hook(
                lambda mod, sd, prefix, meta, strict, missing, unexpected, errors, n=name: (
                    log.append(
                        (n, prefix, dict(meta), strict, sorted(sd), list(missing), list(unexpected))
                    )
                )
            )
        sd = m.state_dict()
        del sd["stem.weight"]
        m.load_state_dict(sd, strict=False)
        m.load_state_dict(m.state_dict(), assign=True)
        return log

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_load_pre_hook_can_rename_old_keys_like_torch():
    def run(s):
        m = s.nn.Sequential(s.nn.Linear(2, 2))

        def rename(mod, sd, prefix, *rest):
            for old in [k for k in sd if k.startswith(prefix + "w_")]:
                sd[prefix + old[len(prefix) + 2 :]] = sd.pop(old)

        m[0].register_load_state_dict_pre_hook(rename)
        out = m.load_state_dict({"0.w_weight": s.arr(np.ones((2, 2))), "0.w_bias": s.arr([1, 2])})
        return repr(out), m.state_dict()

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert j == t


@pytest.mark.torch
def test_load_post_hooks_see_keys_and_can_clear_them_like_torch():
    def run(s):
        log = []
        m = cls(s, "Net")()
        for name, sub in m.named_modules():
            sub.register_load_state_dict_post_hook(
                lambda mod, keys, n=name: log.append((n, list(keys.missing_keys), list(keys[1])))
            )
        sd = m.state_dict()
        sd["surplus"] = s.arr([0.0])
        del sd["heads.cls.bias"]
        failing = outcome(lambda: m.load_state_dict(sd))

        def forgive(mod, keys):
            keys.missing_keys.clear()
            keys.unexpected_keys.clear()

        handle = m.register_load_state_dict_post_hook(forgive)
        forgiven = repr(m.load_state_dict(sd))
        handle.remove()
        return log, failing, forgiven, outcome(lambda: m.load_state_dict(sd))

    t, j = outcomes(run)
    assert t[0] == "ok"
    assert t[1][2] == "<All keys matched successfully>"
    assert j == t


@pytest.mark.torch
def test_load_post_hook_must_return_none_like_torch():
    def run(s):
        m = s.nn.Linear(1, 1)
        m.register_load_state_dict_post_hook(lambda mod, keys: keys)
        return m.load_state_dict(m.state_dict())

    t, j = outcomes(run)
    assert t[:2] == ("raise", "AssertionError")
    assert j == t


@pytest.mark.torch
def test_messages_are_normalized_only_for_framework_names():
    # The helper that maps torch's wording must not hide real differences.
    assert normalize("copying a param with shape torch.Size([2, 7])") == (
        "copying a param with shape (2, 7)"
    )
    assert normalize("shape torch.Size([3])") == "shape (3,)"
    assert normalize("cannot assign 'torch.FloatTensor' as parameter") == (
        "cannot assign 'jax.Array' as parameter"
    )


@pytest.mark.torch
def test_load_into_a_compiled_module_is_seen_by_the_next_call():
    t, j = build("net")
    t.eval()
    j.eval()
    j.compile()
    xt, xj = (torch.ones(2, 4), jnp.ones((2, 4)))
    j(xj)  # compiled with the old state
    fresh = cls(TORCH, "Net")().eval()
    j.load_state_dict(fresh.state_dict())
    with torch.no_grad():
        expected = to_numpy(fresh(xt))
    np.testing.assert_allclose(to_numpy(j(xj)), expected, rtol=1e-5, atol=1e-5)
