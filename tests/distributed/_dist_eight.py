"""Scale-out checks on 8 simulated CPU devices (issue 7).

Not collected by the main run: ``tests/distributed/test_distributed.py`` runs this file in
its own pytest process with ``XLA_FLAGS=--xla_force_host_platform_device_count=8``
(which must be set before JAX starts) and reports each test here as one of its
own.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _dist_models import BIG_CONFIG, Big, Block, batch, classifier, run_steps, values
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import jmodule as jm
import jmodule.distributed as dist
import jmodule.optim
import jmodule.serialization
from jmodule import nn
from jmodule.nn import init

assert jax.device_count() == 8, (
    "run through tests/distributed/test_distributed.py (it sets XLA_FLAGS)"
)

TOL = {"rtol": 2e-5, "atol": 2e-6}


@pytest.fixture(scope="module")
def mesh8():
    return dist.make_mesh()


@pytest.fixture(scope="module")
def mesh2x4():
    return dist.make_mesh({"data": 2, "model": 4})


def mlp(width=16, classes=8):
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, classes))


def spec_of(x):
    return x.sharding.spec


def per_device_bytes(arrays):
    """Bytes each device holds of ``arrays`` (device id -> bytes)."""
    out = {}
    for a in arrays:
        for s in a.addressable_shards:
            out[s.device.id] = out.get(s.device.id, 0) + s.data.nbytes
    return out


# ------------------------------------------------------------------ model.to(sharding)


def test_to_replicated_sharding_keeps_parameters_and_values(mesh8):
    model = mlp()
    before = values(model)
    params = list(model.parameters())
    opt = jm.optim.SGD(model.parameters(), lr=0.1)
    assert model.to(dist.replicated(mesh8)) is model
    assert [id(p) for p in model.parameters()] == [id(p) for p in params]
    assert opt.param_groups[0]["params"][0] is params[0]
    for name, p in model.named_parameters():
        assert p.sharding.is_fully_replicated, name
        assert p.sharding.device_set == set(jax.devices())
        np.testing.assert_array_equal(np.asarray(p), before[name])
    x = jnp.ones((4, 8))
    np.testing.assert_allclose(np.asarray(model(x)), np.asarray(mlp_from(before)(x)), **TOL)


def mlp_from(state):
    model = mlp()
    model.load_state_dict(state)
    return model


def test_to_non_replicated_sharding_splits_every_array(mesh8):
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    before = values(model)
    model.to(NamedSharding(mesh8, P("data")))
    for name, p in model.named_parameters():
        assert spec_of(p) == P("data")
        shard_rows = {s.data.shape[0] for s in p.addressable_shards}
        assert shard_rows == {p.shape[0] // 8}, name
        np.testing.assert_array_equal(np.asarray(p), before[name])
    x = dist.shard_batch(jnp.arange(64.0).reshape(8, 8) / 64, mesh8)
    np.testing.assert_allclose(
        np.asarray(model(x)), np.asarray(mlp_from(before)(np.asarray(x))), **TOL
    )


# ------------------------------------------------------------------ shard(): rules


def test_shard_rules_first_match_wins_and_unmatched_are_replicated(mesh2x4):
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 4))
    weight = model[0].weight
    before = values(model)
    rules = {
        "0.weight": P(None, "model"),
        "[02].weight": P("model", None),
        "2.bias": P("model"),
        "*.running_mean": lambda name, shape: None,  # no opinion: falls through
    }
    assert dist.shard(model, mesh2x4, rules) is model
    specs = {n: spec_of(v) for n, v in model.state_dict(keep_vars=True).items()}
    assert specs["0.weight"] == P(None, "model")  # the first matching rule
    assert specs["2.weight"] == P("model", None)
    assert specs["2.bias"] == P("model")
    for unmatched in ("0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var"):
        assert specs[unmatched] == P(), unmatched
    assert model.state_dict()["1.num_batches_tracked"].sharding.is_fully_replicated
    assert model[0].weight is weight
    for name, v in values(model).items():
        np.testing.assert_array_equal(v, before[name])
    # named_parameters() entries expose .sharding (Parameter delegates to its array)
    planned = dist.shardings(model, mesh2x4, rules)
    assert list(planned) == list(model.state_dict())
    for name, p in model.named_parameters():
        assert p.sharding == planned[name], name


def test_leading_star_dot_matches_top_level_names(mesh2x4):
    layer = dist.shard(nn.Linear(4, 8), mesh2x4, [("*.weight", P("model")), ("*.bias", P("data"))])
    assert spec_of(layer.weight) == P("model")
    assert spec_of(layer.bias) == P("data")


def test_shard_moves_grads_with_their_parameters(mesh2x4):
    layer = nn.Linear(4, 8)
    jm.backward(lambda: jnp.sum(layer(jnp.ones((2, 4)))))
    dist.shard(layer, mesh2x4, {"weight": P("model", None)})
    assert spec_of(layer.weight.grad) == P("model", None)


def test_rule_errors_name_parameter_shape_and_rule_and_change_nothing(mesh2x4):
    model = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 4))
    before = {n: p.sharding for n, p in model.named_parameters()}
    rules = {"0.weight": P("model", None), "1.weight": P("tensor"), "*.bias": P("data", "model")}
    with pytest.raises(dist.ShardingRuleError) as info:
        dist.shard(model, mesh2x4, rules)
    msg = str(info.value)
    assert "cannot shard 4 array(s) of Sequential on the mesh {'data': 2, 'model': 4}" in msg
    assert (
        "'0.weight' of shape (6, 8): rule '0.weight' -> P('model', None): dimension 0 (size 6) "
        "is not divisible by 4, the number of devices along mesh axis 'model'"
    ) in msg
    assert (
        "'1.weight' of shape (4, 6): rule '1.weight' -> P('tensor',): mesh axis 'tensor' is "
        "not in the mesh (its axes are 'data', 'model')"
    ) in msg
    assert "'0.bias' of shape (6,): rule '*.bias' -> P('data', 'model'): the spec has 2 " in msg
    assert "first matching rule wins" in msg
    assert {n: p.sharding for n, p in model.named_parameters()} == before


def test_callable_rule_errors_show_the_spec_it_chose(mesh8):
    with pytest.raises(dist.ShardingRuleError, match=r"'bias' of shape \(3,\): rule 'bias'"):
        dist.shard(nn.Linear(2, 3), mesh8, {"bias": lambda name, shape: P("data")})
    with pytest.raises(dist.ShardingRuleError, match="returned 'data', not a PartitionSpec"):
        dist.shard(nn.Linear(2, 8), mesh8, {"bias": lambda name, shape: "data"})
    with pytest.raises(TypeError, match=r"rule 'weight': expected a jax\.sharding\.PartitionSpec"):
        dist.shard(nn.Linear(2, 8), mesh8, {"weight": ("data",)})
    with pytest.raises(dist.ShardingRuleError, match="mesh axis 'data' is used for more than"):
        dist.shard(nn.Linear(8, 8), mesh8, {"weight": P("data", "data")})


# ------------------------------------------------------------------ presets


def test_fsdp_splits_largest_divisible_dimension_and_divides_memory(mesh8):
    model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 5), nn.BatchNorm1d(5))
    dist.shard(model, mesh8, dist.fsdp(mesh8))
    specs = {n: spec_of(v) for n, v in model.state_dict(keep_vars=True).items()}
    assert specs["0.weight"] == P("data")  # (64, 24): 64 is the largest divisible
    assert specs["0.bias"] == P("data")
    assert specs["2.weight"] == P(None, "data")  # (5, 64): only dim 1 divides
    assert specs["2.bias"] == P()  # (5,): nothing divides, replicated
    assert specs["3.running_mean"] == P()
    big = [model[0].weight.data, model[0].bias.data, model[2].weight.data]
    total = sum(a.nbytes for a in big)
    assert set(per_device_bytes(big).values()) == {total // 8}


def test_fsdp_min_size_keeps_small_arrays_replicated(mesh8):
    model = dist.shard(nn.Linear(16, 64), mesh8, dist.fsdp(mesh8, min_size=100))
    assert spec_of(model.weight) == P("data")
    assert spec_of(model.bias) == P()


def test_tensor_parallel_column_row_pairs_combined_with_fsdp(mesh2x4):
    jm.manual_seed(0)
    ref = Block()
    model = Block()
    model.load_state_dict(ref.state_dict())
    rules = dist.tensor_parallel(mesh2x4) + dist.fsdp(mesh2x4)
    dist.shard(model, mesh2x4, rules)
    specs = {n: spec_of(p) for n, p in model.named_parameters()}
    assert specs == {
        "norm.weight": P("data"),  # not a TP layer: FSDP takes it
        "norm.bias": P("data"),
        "attn.in_proj_weight": P("model", None),  # column parallel
        "attn.in_proj_bias": P("model"),
        "attn.out_proj.weight": P(None, "model"),  # row parallel
        "attn.out_proj.bias": P(),
        "fc1.weight": P("model", None),
        "fc1.bias": P("model"),
        "fc2.weight": P(None, "model"),
        "fc2.bias": P(),
    }
    x = jax.random.normal(jax.random.PRNGKey(1), (4, 5, 16))
    model.compile()
    ref.compile()
    out = model(dist.shard_batch(x, mesh2x4))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref(x)), **TOL)


def test_tensor_parallel_plan_comes_first_and_checks_styles(mesh2x4):
    model = nn.Sequential()
    model.up, model.down = nn.Linear(8, 16), nn.Linear(16, 8)
    plan = {"up": "colwise", "down": "rowwise"}
    dist.shard(model, mesh2x4, dist.tensor_parallel(mesh2x4, plan=plan, defaults=False))
    assert spec_of(model.up.weight) == P("model", None)
    assert spec_of(model.down.weight) == P(None, "model")
    with pytest.raises(ValueError, match="style must be 'colwise' or 'rowwise', got 'diagonal'"):
        dist.tensor_parallel(mesh2x4, plan={"up": "diagonal"})
    with pytest.raises(ValueError, match="mesh axis 'tp' is not in the mesh"):
        dist.tensor_parallel(mesh2x4, axis="tp")


# ------------------------------------------------------------------ compiled steps


@pytest.mark.parametrize("layout", ["data_parallel", "fsdp", "fsdp_tensor_parallel"])
def test_compiled_sharded_step_matches_one_device(layout, mesh8, mesh2x4):
    x, y = batch()
    jm.manual_seed(0)
    ref = classifier()
    model = classifier()
    model.load_state_dict(ref.state_dict())
    mesh = mesh2x4 if layout == "fsdp_tensor_parallel" else mesh8
    if layout == "data_parallel":
        model.to(dist.replicated(mesh))
    elif layout == "fsdp":
        dist.shard(model, mesh, dist.fsdp(mesh))
    else:
        plan = {"0": "colwise", "3": "rowwise"}
        dist.shard(model, mesh, dist.tensor_parallel(mesh, plan=plan) + dist.fsdp(mesh))
    placed = {n: v.sharding for n, v in model.state_dict().items()}
    ref_losses, _ = run_steps(ref, jm.optim.Adam(ref.parameters(), lr=1e-2), x, y)
    ref_losses = [float(v) for v in ref_losses]
    opt = jm.optim.Adam(model.parameters(), lr=1e-2)
    xs, ys = dist.shard_batch((x, y), mesh)
    losses, step = run_steps(model, opt, xs, ys)
    np.testing.assert_allclose([float(v) for v in losses], ref_losses, **TOL)
    for name, v in values(model).items():
        np.testing.assert_allclose(v, values(ref)[name], err_msg=name, **TOL)
    # the state stays where it was put (XLA reduced the gradients into that layout) ...
    assert {n: v.sharding for n, v in model.state_dict().items()} == placed
    for p in model.parameters():
        assert p.grad.sharding == p.sharding
    # ... so later steps reuse the program
    traces = jm.compile_stats(step).num_traces
    step(model, opt, xs, ys)
    assert jm.compile_stats(step).num_traces == traces


@pytest.mark.parametrize("layout", ["data_parallel", "fsdp"])
def test_compiled_sharded_step_moves_no_state_between_devices(layout, mesh8):
    """Every input of a settled step already lives where the program wants it
    (the optimizer's hyper-parameters included), so a call copies nothing."""
    model = classifier()
    if layout == "data_parallel":
        model.to(dist.replicated(mesh8))
    else:
        dist.shard(model, mesh8, dist.fsdp(mesh8))
    opt = jm.optim.Adam(model.parameters(), lr=1e-2)
    sched = jm.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    xs, ys = dist.shard_batch(batch(), mesh8)
    _, step = run_steps(model, opt, xs, ys, steps=2)
    sched.step()  # a new learning rate is a new hyper-parameter array
    with jax.transfer_guard_device_to_device("disallow"):
        for _ in range(2):
            step(model, opt, xs, ys)
            sched.step()


def test_sharded_parameters_share_one_step_count_like_optax(mesh8):
    """The compiled FSDP Adam step takes optax's state over the parameter tree (one
    count for all parameters, not one per parameter) plus the hyper-parameter array."""
    model = dist.shard(mlp(), mesh8, dist.fsdp(mesh8))
    opt = jm.optim.Adam(model.parameters(), lr=1e-2)
    xs, ys = dist.shard_batch(batch(16), mesh8)
    _, step = run_steps(model, opt, xs, ys, steps=2)
    params = {n: p.data for n, p in model.named_parameters()}
    optax_state = jax.tree.leaves(optax.adam(1e-2).init(params))
    inputs = jax.tree.leaves(step.lower(model, opt, xs, ys).args_info)
    # the parameters (zero_grad() comes first: no grads in), optax's state, the
    # hyper-parameter array, jm's random state, x and y
    assert len(inputs) == len(params) + len(optax_state) + 1 + 1 + 2
    for p in model.parameters():
        assert isinstance(opt.state[p], jm.optim.PackedState)
        assert opt.state[p]["exp_avg"].sharding == p.sharding


def test_sharded_parameters_that_skip_steps_match_one_device(mesh8):
    """Counts part ways when some parameters have no gradient, as PyTorch's do."""
    jm.manual_seed(0)
    ref = mlp()
    model = mlp()
    model.load_state_dict(ref.state_dict())
    dist.shard(model, mesh8, dist.fsdp(mesh8))
    opts = [jm.optim.AdamW(m.parameters(), lr=1e-2, amsgrad=True) for m in (ref, model)]
    rng = np.random.default_rng(0)
    shapes = [p.shape for p in ref.parameters()]
    for skip in [set(), {1}, {0, 3}, set()]:
        grads = [
            None if i in skip else rng.standard_normal(s).astype(np.float32)
            for i, s in enumerate(shapes)
        ]
        for m, opt in zip((ref, model), opts):
            for p, g in zip(m.parameters(), grads):
                p.grad = None if g is None else jax.device_put(g, p.sharding)
            opt.step()
    for name, v in values(model).items():
        np.testing.assert_allclose(v, values(ref)[name], err_msg=name, **TOL)
    want, got = (opt.state_dict()["state"] for opt in opts)
    assert [int(s["step"]) for s in got.values()] == [int(s["step"]) for s in want.values()]
    for i in want:
        for k in want[i]:
            np.testing.assert_allclose(np.asarray(got[i][k]), np.asarray(want[i][k]), **TOL)


@pytest.mark.parametrize(
    "make",
    [
        lambda ps: jm.optim.Adam(ps, lr=1e-2),
        lambda ps: jm.optim.AdamW(ps, lr=1e-2, amsgrad=True),
        lambda ps: jm.optim.SGD(ps, lr=0.1, momentum=0.9),
        lambda ps: jm.optim.RMSprop(ps, lr=1e-2, momentum=0.5, centered=True),
        lambda ps: jm.optim.Adagrad(ps, lr=0.1),
    ],
    ids=["Adam", "AdamW-amsgrad", "SGD-momentum", "RMSprop", "Adagrad"],
)
def test_optimizer_state_follows_parameter_sharding(make, mesh8):
    model = dist.shard(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)), mesh8, dist.fsdp(mesh8))
    opt = make(model.parameters())
    x, y = batch(16)
    run_steps(model, opt, *dist.shard_batch((x, y), mesh8), steps=2)
    state = opt.state_dict()["state"]
    params = list(model.parameters())
    checked = 0
    for i, p in enumerate(params):
        for name, v in state[i].items():
            if getattr(v, "shape", ()) == p.shape:
                assert v.sharding == p.sharding, (i, name)
                checked += 1
    assert checked >= len(params)


# ------------------------------------------------------------------ SyncBatchNorm


def test_sync_batchnorm_in_compiled_step_matches_one_device(mesh8):
    x, y = batch()
    jm.manual_seed(0)
    ref = classifier()
    model = nn.SyncBatchNorm.convert_sync_batchnorm(classifier())
    assert type(model[1]) is nn.SyncBatchNorm
    model.load_state_dict(ref.state_dict())
    model.to(dist.replicated(mesh8))
    ref_losses, _ = run_steps(ref, jm.optim.SGD(ref.parameters(), lr=0.1), x, y)
    opt = jm.optim.SGD(model.parameters(), lr=0.1)
    losses, _ = run_steps(model, opt, *dist.shard_batch((x, y), mesh8))
    np.testing.assert_allclose(np.array(losses), np.array(ref_losses), **TOL)
    for name, v in values(model).items():  # running statistics included
        np.testing.assert_allclose(v, values(ref)[name], err_msg=name, **TOL)


def test_sync_batchnorm_inside_shard_map_uses_global_statistics(mesh8):
    x = np.random.default_rng(1).standard_normal((32, 4, 3)).astype(np.float32)
    x[:4] += 5.0  # device 0's local batch has other statistics than the rest
    sync, plain = nn.SyncBatchNorm(4), nn.BatchNorm1d(4)

    def per_device(module):
        local = jax.shard_map(
            lambda xs: jm.func.functional_call(module, {}, xs),
            mesh=mesh8,
            in_specs=P("data"),
            out_specs=P("data"),
        )
        return np.asarray(jax.jit(local)(x))

    global_stats = np.asarray(nn.BatchNorm1d(4)(jnp.asarray(x)))
    np.testing.assert_allclose(per_device(sync), global_stats, **TOL)
    assert not np.allclose(per_device(plain), global_stats, atol=1e-2)


# ------------------------------------------------------------------ constrain


def test_constrain_pins_activation_sharding_inside_a_compiled_forward(mesh8):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 16)

        def forward(self, x):
            return dist.constrain(self.fc(x), P(None, "data"), mesh8)

    net = Net()
    x = jnp.ones((4, 8))
    eager = net(x)
    assert spec_of(eager) == P(None, "data")
    hlo = jax.jit(lambda s, v: jm.func.functional_call(net, s, v)).lower(net.state_dict(), x)
    assert 'sdy.sharding_constraint %4 <@mesh, [{}, {"data"}]>' in hlo.as_text()
    net.compile()
    out = net(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(eager), **TOL)
    assert spec_of(out) == P(None, "data")


def test_constrain_with_a_mesh_context_or_sharding_and_errors(mesh8):
    x = jnp.ones((8, 2))
    with jax.set_mesh(mesh8):
        out = jax.jit(lambda v: dist.constrain(v * 2, P("data")))(x)
    assert spec_of(out) == P("data")
    assert spec_of(dist.constrain(nn.Parameter(x), NamedSharding(mesh8, P("data")))) == P("data")
    with pytest.raises(ValueError, match=r"needs a mesh to resolve the PartitionSpec: pass mesh="):
        dist.constrain(x, P("data"))
    with pytest.raises(TypeError, match="PartitionSpec or Sharding, got str"):
        dist.constrain(x, "data")


# ------------------------------------------------------------------ meta init, to_empty


def test_meta_model_sharded_abstractly_needs_an_eighth_per_device(mesh8):
    with jm.device("meta"):
        model = Big(**BIG_CONFIG)
    dist.shard(model, mesh8, dist.fsdp(mesh8))
    params = list(model.parameters())
    assert all(jm.is_meta(p) for p in params)
    total = sum(math.prod(p.shape) * 4 for p in params)
    per_device = sum(math.prod(p.sharding.shard_shape(p.shape)) * 4 for p in params)
    assert total > 300e9 * 4
    assert per_device == total // 8


def _same_draw(got, want, name):
    """The same random bits drawn: scaling them to ``[low, high)`` rounds once (a fused
    multiply-add, as an unsharded model's host draw does, ``jmodule._threefry``) or twice
    (whatever XLA compiles for a sharded program), so the last bit may differ."""
    want = np.asarray(want)
    if not np.issubdtype(want.dtype, np.floating) or not want.size:
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    ulp = 2 * float(np.spacing(np.abs(want).max().astype(want.dtype)))
    np.testing.assert_allclose(got, want, rtol=0, atol=ulp, err_msg=name)


def test_to_empty_with_rules_then_reset_parameters_fills_shards_in_place(mesh8, monkeypatch):
    programs = []
    make = init._sharded

    def spy(fn, shape, dtype, sharding, n_keys):  # record what each init program costs a device
        jitted = make(fn, shape, dtype, sharding, n_keys)

        def run(*args):
            programs.append((shape, jitted.lower(*args).compile().memory_analysis()))
            return jitted(*args)

        return run

    monkeypatch.setattr(init, "_sharded", spy)
    jm.manual_seed(3)
    with jm.device("meta"):
        model = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024))
    rules = dist.fsdp(mesh8)
    model.to_empty(device=(mesh8, rules))
    expected = dist.shardings(model, mesh8, rules)
    for name, p in model.named_parameters():
        assert p.sharding == expected[name]
        assert not np.asarray(p).any()
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    for name, p in model.named_parameters():
        assert p.sharding == expected[name], name
    # the same draws as an unsharded model seeded the same (threefry is partitionable)
    jm.manual_seed(3)
    ref = nn.Sequential(nn.Linear(1024, 2048), nn.ReLU(), nn.Linear(2048, 1024))
    for name, v in values(model).items():
        _same_draw(v, values(ref)[name], name)
    # memory: each device holds 1/8 of each parameter, and no init program needs a whole one
    arrays = [p.data for p in model.parameters()]
    total = sum(a.nbytes for a in arrays)
    assert set(per_device_bytes(arrays).values()) == {total // 8}
    assert len(programs) == 4
    for shape, stats in programs:
        full = math.prod(shape) * 4
        assert stats.output_size_in_bytes == full // 8
        assert stats.output_size_in_bytes + stats.temp_size_in_bytes < full


@pytest.mark.parametrize("spec", [P(), P("data")], ids=["replicated", "split"])
def test_to_empty_with_one_sharding_then_reset_parameters_on_shards(spec, mesh8):
    where = NamedSharding(mesh8, spec)

    def build():  # BatchNorm's scalar count fits only a replicated spec
        norm = [nn.BatchNorm1d(8)] if spec == P() else [nn.LayerNorm(8)]
        return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), *norm)

    jm.manual_seed(5)
    with jm.device("meta"):
        model = build()
    assert model.to_empty(device=where) is model
    for name, v in model.state_dict().items():
        assert v.sharding == where, name
        assert not np.asarray(v).any(), name
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    jm.manual_seed(5)
    ref = values(build())
    for name, v in model.state_dict().items():
        assert v.sharding == where, name
        _same_draw(np.asarray(v), ref[name], name)
    arrays = [p.data for p in model.parameters()]
    share = 1 if spec == P() else 8
    assert set(per_device_bytes(arrays).values()) == {sum(a.nbytes for a in arrays) // share}


def test_one_sharding_that_cannot_hold_an_array_names_it_and_moves_nothing(mesh8):
    where = NamedSharding(mesh8, P("data"))
    model = nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4), nn.BatchNorm1d(4))
    before = {k: v.sharding for k, v in model.state_dict().items()}
    with pytest.raises(dist.ShardingRuleError) as info:
        model.to(where)
    msg = str(info.value)
    state = model.state_dict()
    misfits = {k for k, v in state.items() if v.ndim == 0 or v.shape[0] % 8}
    assert f"cannot place {len(misfits)} array(s) of Sequential with P('data',) on the mesh " in msg
    for name, v in state.items():
        assert (f"'{name}' of shape {v.shape}: " in msg) == (name in misfits), name
    assert (
        "'1.weight' of shape (4, 16): dimension 0 (size 4) is not divisible by 8, the number "
        "of devices along mesh axis 'data'"
    ) in msg
    assert "'2.num_batches_tracked' of shape (): the spec has 1 entries but the array has 0" in msg
    assert {k: v.sharding for k, v in model.state_dict().items()} == before
    with jm.device("meta"):
        meta = nn.Linear(8, 4)
    with pytest.raises(dist.ShardingRuleError, match=r"'weight' of shape \(4, 8\): dimension 0"):
        meta.to_empty(device=where)
    assert jm.is_meta(meta.weight)


def test_to_empty_rule_errors_allocate_nothing(mesh8):
    with jm.device("meta"):
        layer = nn.Linear(3, 5)
    with pytest.raises(dist.ShardingRuleError, match=r"'weight' of shape \(5, 3\)"):
        layer.to_empty(device=(mesh8, {"weight": P("data")}))
    assert jm.is_meta(layer.weight)


# ------------------------------------------------------------------ checkpoints (issue 6 API)


def test_checkpoint_of_sharded_model_round_trips_8_4_1_8_devices(tmp_path):
    meshes = {n: dist.make_mesh(devices=jax.devices()[:n]) for n in (8, 4, 1)}

    def sharded(n):
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        return dist.shard(model, meshes[n], dist.fsdp(meshes[n]))

    jm.manual_seed(0)
    model = sharded(8)
    original = values(model)
    path = tmp_path / "8"
    jmodule.serialization.save(model.state_dict(), path)
    for n, previous in ((4, path), (1, tmp_path / "4"), (8, tmp_path / "1")):
        # every array here splits on dim 0, so one sharding restores them all
        where = NamedSharding(meshes[n], P("data"))
        state = jmodule.serialization.load(previous, map_location=where)
        for name, v in state.items():
            assert v.sharding == where, name
        target = sharded(n)
        target.load_state_dict(state)
        for name, v in values(target).items():
            np.testing.assert_array_equal(v, original[name], err_msg=f"{name} on {n}")
        assert {p.sharding.mesh.size for p in target.parameters()} == {n}
        if n != 8:
            jmodule.serialization.save(target.state_dict(), tmp_path / str(n))


def test_sharded_checkpoint_checksums_each_shard_without_gathering(mesh8, tmp_path, monkeypatch):
    """Save and verify look at one shard at a time: the largest buffer checksummed
    is a shard, never the whole array, whichever mesh the load restores onto."""
    from jmodule.serialization import _checksum

    seen: list[int] = []
    real = _checksum.host_bytes

    def spy(x):
        out = real(x)
        seen.append(out.nbytes)
        return out

    monkeypatch.setattr(_checksum, "host_bytes", spy)
    full = jnp.arange(64 * 32, dtype=jnp.float32).reshape(64, 32)
    x = jax.device_put(full, NamedSharding(mesh8, P("data")))
    shard_bytes = x.addressable_shards[0].data.nbytes
    jmodule.serialization.save({"w": x, "b": jnp.ones(4)}, tmp_path / "c")
    assert max(seen) == shard_bytes < full.nbytes  # 8 shards of w, then b
    assert seen.count(shard_bytes) == 8
    for n in (4, 1):
        seen.clear()
        mesh = dist.make_mesh(devices=jax.devices()[:n])
        where = NamedSharding(mesh, P("data"))
        state = jmodule.serialization.load(tmp_path / "c", map_location=where)
        np.testing.assert_array_equal(np.asarray(state["w"]), np.asarray(full))
        assert max(seen) == shard_bytes  # the saved shards' regions, one at a time


def test_checkpoint_restores_each_key_onto_its_own_sharding(mesh8, tmp_path):
    """``map_location={key: sharding}``: listed keys go to their sharding, the rest to
    the default placement (here a second, replicated sharding given in a tuple)."""
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    jmodule.serialization.save(model.state_dict(), tmp_path / "c")
    rows, cols = NamedSharding(mesh8, P("data")), NamedSharding(mesh8, P(None, "data"))
    rest = NamedSharding(mesh8, P())
    state = jmodule.serialization.load(
        tmp_path / "c", map_location=(rest, {"0.weight": rows, "2.weight": cols})
    )
    assert state["0.weight"].sharding == rows and state["2.weight"].sharding == cols
    assert state["0.bias"].sharding == rest and state["2.bias"].sharding == rest
    for name, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(state[name]), np.asarray(v), err_msg=name)
    with pytest.raises(ValueError, match=r"cannot hold '0\.bias' of shape \(16,\)"):
        jmodule.serialization.load(tmp_path / "c", map_location={"0.bias": cols})


def test_checkpoint_with_optimizer_state_restores_onto_another_mesh(mesh8, tmp_path):
    mesh4 = dist.make_mesh(devices=jax.devices()[:4])
    model = dist.shard(nn.Linear(8, 16), mesh8, dist.fsdp(mesh8))
    opt = jm.optim.Adam(model.parameters(), lr=1e-2)
    x, y = batch(16)
    run_steps(model, opt, *dist.shard_batch((x, jnp.asarray(y) % 8), mesh8), steps=1)
    saved = {"model": model.state_dict(), "opt": opt.state_dict()}
    jmodule.serialization.save(saved, tmp_path / "ckpt")
    loaded = jmodule.serialization.load(tmp_path / "ckpt", map_location=dist.replicated(mesh4))
    target = dist.shard(nn.Linear(8, 16), mesh4, dist.fsdp(mesh4))
    target.load_state_dict(loaded["model"])
    target_opt = jm.optim.Adam(target.parameters(), lr=1e-2)
    target_opt.load_state_dict(loaded["opt"])
    for name, v in values(target).items():
        np.testing.assert_array_equal(v, np.asarray(saved["model"][name]))
        assert target.state_dict()[name].sharding.mesh.size == 4
    for i, entry in target_opt.state_dict()["state"].items():
        for k, v in entry.items():
            np.testing.assert_array_equal(np.asarray(v), np.asarray(saved["opt"]["state"][i][k]))
