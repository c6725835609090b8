"""``model.load_state_dict(jm.load(path))`` for every format, against live PyTorch."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from _torch import safetensors_torch, torch

import jmodule as jm
import jmodule.serialization as jms
from jmodule.checkpoint import CheckpointManager


def _jm_model(width: int = 4):
    return jm.nn.Sequential(
        jm.nn.Linear(3, width), jm.nn.BatchNorm1d(width), jm.nn.Linear(width, 2)
    )


def _torch_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2)
    )
    model.train()
    model(torch.randn(16, 3) * 3 + 1)  # non-trivial running statistics
    return model.eval()


def _inputs():
    return np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)


def _outputs(model) -> np.ndarray:
    model.eval()
    return np.asarray(model(jnp.asarray(_inputs())))


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return list(sa) == list(sb) and all(
        np.asarray(sa[k]).dtype == np.asarray(sb[k]).dtype
        and np.array_equal(np.asarray(sa[k]), np.asarray(sb[k]))
        for k in sa
    )


def test_jm_checkpoint_round_trip_into_a_fresh_model(tmp_path):
    jm.manual_seed(1)
    source = _jm_model()
    source.train()
    source(jnp.asarray(_inputs()) * 2)  # update the BatchNorm buffers
    jms.save({"model": source.state_dict(), "epoch": 3}, tmp_path / "ckpt")
    jm.manual_seed(2)
    target = _jm_model()
    assert not _same_state(source, target)
    loaded = jms.load(tmp_path / "ckpt")
    assert loaded["epoch"] == 3
    assert loaded["model"]._metadata == source.state_dict()._metadata
    result = target.load_state_dict(loaded["model"])
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert _same_state(source, target)
    np.testing.assert_array_equal(_outputs(target), _outputs(source))


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("fmt", ["zip", "legacy", "safetensors"])
def test_pytorch_weights_load_into_the_jm_model_and_match_torch(tmp_path, fmt):
    reference = _torch_model()
    sd = reference.state_dict()
    if fmt == "safetensors":
        path = tmp_path / "model.safetensors"
        safetensors_torch.save_file(sd, path)
    else:
        path = tmp_path / "pytorch_model.bin"
        torch.save(sd, path, _use_new_zipfile_serialization=fmt == "zip")
    model = _jm_model()
    model.load_state_dict(jms.load(path))
    with torch.no_grad():
        expected = reference(torch.from_numpy(_inputs())).numpy()
    np.testing.assert_allclose(_outputs(model), expected, rtol=1e-5, atol=1e-6)
    assert int(model.state_dict()["1.num_batches_tracked"]) == int(sd["1.num_batches_tracked"])


def test_manager_restore_into_a_model(tmp_path):
    jm.manual_seed(3)
    source = _jm_model()
    with CheckpointManager(tmp_path, max_to_keep=1) as manager:
        manager.save(100, {"model": source.state_dict()})
        jm.manual_seed(4)
        target = _jm_model()
        target.load_state_dict(manager.restore()["model"])
    assert _same_state(source, target)


def test_load_state_dict_stays_all_or_nothing_on_a_mismatched_file(tmp_path):
    jm.manual_seed(5)
    jms.save(_jm_model(width=5).state_dict(), tmp_path / "wider")
    jm.manual_seed(6)
    model = _jm_model(width=4)
    before = {k: np.asarray(v).copy() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match=r"size mismatch for 0\.weight.*\(5, 3\).*\(4, 3\)"):
        model.load_state_dict(jms.load(tmp_path / "wider"))
    after = model.state_dict()
    assert all(np.array_equal(before[k], np.asarray(after[k])) for k in before)


def test_map_location_dtype_then_load(tmp_path):
    jm.manual_seed(7)
    source = _jm_model()
    jms.save(source.state_dict(), tmp_path / "c")
    half = jms.load(tmp_path / "c", map_location=jnp.bfloat16)
    assert (
        half["0.weight"].dtype == jnp.bfloat16 and half["1.num_batches_tracked"].dtype == jnp.int32
    )
    model = _jm_model().to(jm.bfloat16)
    model.load_state_dict(half)
    assert model.state_dict()["0.weight"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        np.asarray(model.state_dict()["0.weight"]),
        np.asarray(source.state_dict()["0.weight"].astype(jnp.bfloat16)),
    )
