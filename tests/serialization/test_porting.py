"""Porting PyTorch checkpoints: BatchNorm's ``num_batches_tracked`` and the ``_metadata``
versions of ``state_dict()``, as ``_NormBase._load_from_state_dict`` has them (torch live)."""

from __future__ import annotations

import collections

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from _paths import ROOT
from shared_models import resnet18

import jmodule as jm
from jmodule import nn

pytestmark = pytest.mark.torch


def _tree(nn_):
    return nn_.Sequential(
        nn_.Conv2d(2, 3, 1),
        nn_.BatchNorm2d(3),
        nn_.ReLU(),
        nn_.Sequential(nn_.Flatten(), nn_.Linear(3, 2), nn_.LayerNorm(2)),
        nn_.InstanceNorm1d(2, track_running_stats=True),
    )


def test_state_dict_metadata_matches_torch_for_the_same_tree():
    want = _tree(torch.nn).state_dict()._metadata
    got = _tree(nn).state_dict()._metadata
    assert type(got) is collections.OrderedDict
    assert list(got.items()) == list(want.items())
    want = resnet18(torch.nn).state_dict()._metadata
    assert list(resnet18(jm.nn).state_dict()._metadata.items()) == list(want.items())


def _prefixed_metadata(version, prefix=""):
    if version is None:
        return None
    return collections.OrderedDict({"": {"version": 1}, prefix.rstrip("."): {"version": version}})


def _without_count(sd, prefix):
    return {k: v for k, v in sd.items() if k != prefix + "num_batches_tracked"}


def _load(module, sd, strict):
    try:
        r = module.load_state_dict(sd, strict=strict)
    except RuntimeError as e:
        return ("RuntimeError", str(e))
    return ("ok", r.missing_keys, r.unexpected_keys)


@pytest.mark.parametrize("version", [None, 1, 2], ids=["no metadata", "v1", "v2"])
@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("nested", [False, True], ids=["bn", "in Sequential"])
def test_a_missing_num_batches_tracked_is_filled_in_unless_metadata_says_v2(
    version, strict, nested
):
    def build(nn_):
        bn = nn_.BatchNorm1d(3)
        return nn_.Sequential(nn_.Linear(3, 3), bn) if nested else bn

    prefix = "1." if nested else ""
    torch.manual_seed(0)
    ref = build(torch.nn)
    ref.train()
    for _ in range(3):  # the module's own count: 3
        ref(torch.randn(4, 3))
    ours = build(nn)
    assert ours.load_state_dict(ref.state_dict()).missing_keys == []
    source = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    source = source if nested else source[1]
    with torch.no_grad():
        for p in source.parameters():
            p.uniform_(-1, 1)
    t_sd = collections.OrderedDict(_without_count(source.state_dict(), prefix))
    j_sd = collections.OrderedDict((k, v.numpy()) for k, v in t_sd.items())
    meta = _prefixed_metadata(version, prefix)
    if meta is not None:
        t_sd._metadata = meta
        j_sd._metadata = collections.OrderedDict(meta)
    want = _load(ref, t_sd, strict)
    got = _load(ours, j_sd, strict)
    assert got == want
    assert prefix + "num_batches_tracked" not in j_sd  # the caller's dict is not changed
    assert int(ours.state_dict()[prefix + "num_batches_tracked"]) == int(
        ref.state_dict()[prefix + "num_batches_tracked"]
    )
    if want[0] != "ok":
        return  # torch has copied some values before raising; jm changes nothing (all or nothing)
    for k, v in ref.state_dict().items():
        np.testing.assert_allclose(np.asarray(ours.state_dict()[k]), v.numpy(), rtol=1e-6)


def test_a_plain_dict_without_the_count_loads_strictly_into_a_fresh_model():
    ref = resnet18(torch.nn)
    sd = {k: v for k, v in ref.state_dict().items() if not k.endswith("num_batches_tracked")}
    want = ref.load_state_dict(sd, strict=True)
    ours = resnet18(jm.nn)
    got = ours.load_state_dict({k: v.numpy() for k, v in sd.items()}, strict=True)
    assert (got.missing_keys, got.unexpected_keys) == (want.missing_keys, want.unexpected_keys)
    counts = [int(v) for k, v in ours.state_dict().items() if k.endswith("num_batches_tracked")]
    assert counts and set(counts) == {0}


def test_a_meta_batchnorm_gets_a_zero_count():
    with jm.device("meta"):
        ours = nn.BatchNorm1d(3)
    with torch.device("meta"):
        ref = torch.nn.BatchNorm1d(3)
    sd = {k: v for k, v in torch.nn.BatchNorm1d(3).state_dict().items() if "num_batches" not in k}
    want = ref.load_state_dict(sd, assign=True)
    got = ours.load_state_dict({k: v.numpy() for k, v in sd.items()}, assign=True)
    assert (got.missing_keys, got.unexpected_keys) == (want.missing_keys, want.unexpected_keys)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 0


@pytest.mark.parametrize("version", [None, 1])
def test_instance_norm_refuses_old_running_stats_it_does_not_track(version):
    donor = torch.nn.InstanceNorm1d(3, track_running_stats=True).state_dict()
    t_sd = collections.OrderedDict(donor)
    if version is not None:
        t_sd._metadata = collections.OrderedDict({"": {"version": version}})
    j_sd = collections.OrderedDict((k, v.numpy()) for k, v in t_sd.items())
    if version is not None:
        j_sd._metadata = t_sd._metadata
    for strict in (True, False):
        want = _load(torch.nn.InstanceNorm1d(3), t_sd, strict)
        got = _load(nn.InstanceNorm1d(3), j_sd, strict)
        assert got == want


def test_a_jm_state_dict_carries_versions_that_torch_honours():
    ours = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    sd = ours.state_dict()
    del sd["1.num_batches_tracked"]  # _metadata still says version 2
    ref = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    t_sd = collections.OrderedDict((k, torch.from_numpy(np.array(v))) for k, v in sd.items())
    t_sd._metadata = sd._metadata
    with pytest.raises(RuntimeError, match="num_batches_tracked") as t_err:
        ref.load_state_dict(t_sd)
    with pytest.raises(RuntimeError, match="num_batches_tracked") as j_err:
        ours.load_state_dict(sd)
    assert str(j_err.value) == str(t_err.value)
    np.testing.assert_array_equal(np.asarray(ours[1].running_var), jnp.ones(2))


@pytest.mark.slow
def test_the_readme_worked_port_runs_both_ways(tmp_path, monkeypatch):
    """README "Porting from PyTorch": the PyTorch code and its port both run, and the
    port's weights, saved by jm, give the PyTorch model the port's outputs."""
    import re

    text = (ROOT / "README.md").read_text()
    section = text.split("## Porting from PyTorch", 1)[1].split("\n## ", 1)[0]
    (before,) = re.findall(r"```py\n(.*?)```", section, flags=re.S)
    (after,) = [
        b for b in re.findall(r"```python\n(.*?)```", section, flags=re.S) if "TinyConvNet" in b
    ]
    monkeypatch.chdir(tmp_path)
    theirs: dict = {}
    exec(compile(before, "README.md", "exec"), theirs)
    ours: dict = {}
    exec(compile(after, "README.md", "exec"), ours)
    assert (tmp_path / "tiny.pt").exists()
    jm.save(ours["net"].state_dict(), tmp_path / "port.pt")
    ref = theirs["net"]
    assert (
        ref.load_state_dict(torch.load(tmp_path / "port.pt", weights_only=True)).missing_keys == []
    )
    ref.eval()
    ours["net"].eval()
    x = np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32)
    with torch.no_grad():
        want = ref(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours["net"](jnp.asarray(x))), want, rtol=1e-4, atol=1e-5)
    # and PyTorch's weights, saved by torch, load into the port
    ours["net"].load_state_dict(jm.load(tmp_path / "tiny.pt"))
    with torch.no_grad():
        want = theirs["TinyConvNet"]()
        want.load_state_dict(torch.load(tmp_path / "tiny.pt", weights_only=True))
        want = want.eval()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.asarray(ours["net"](jnp.asarray(x))), want, rtol=1e-4, atol=1e-5)
