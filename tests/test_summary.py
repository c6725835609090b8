"""jm.summary: per-layer table checked against the same model run in PyTorch."""

import jax.numpy as jnp
import numpy as np
import torch

import jmodule as jm
from jmodule import nn


def _torch_rows(model, x):
    shapes = {}
    for name, m in model.named_modules():
        m.register_forward_hook(
            lambda mod, a, out, name=name: shapes.__setitem__(name, tuple(out.shape))
        )
    model(x)
    return {
        name: (shapes[name], sum(p.numel() for p in m.parameters()))
        for name, m in model.named_modules()
    }


def test_summary_rows_match_pytorch_shapes_and_counts(capsys):
    torch_model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)
    before = {k: np.asarray(v) for k, v in model.state_dict().items()}
    result = jm.summary(model, jnp.ones((3, 4)))
    want = _torch_rows(torch_model, torch.ones(3, 4))
    assert [r.path for r in result.rows] == list(want)
    for row in result.rows:
        assert row.output_shapes == (want[row.path][0],)
        assert row.params == want[row.path][1]
    assert result.total_params == sum(p.numel() for p in torch_model.parameters())
    assert result.trainable_params == result.total_params - 32
    assert result.flops and result.flops > 0
    assert result.memory["arguments"] > 0
    printed = capsys.readouterr().out
    assert printed.strip() == str(result).strip()
    assert "Trainable params: " in printed
    assert "<table>" in result._repr_html_()
    # An abstract run: the model's buffers did not move.
    for k, v in model.state_dict().items():
        np.testing.assert_array_equal(np.asarray(v), before[k])
