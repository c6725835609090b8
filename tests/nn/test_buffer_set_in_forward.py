"""A buffer registered as None and given its value in ``forward`` (issue 27).

``self.register_buffer("mask", None)`` in ``__init__``, then ``self.mask = jnp.tril(...)``
(or ``register_buffer`` again) in ``forward``: PyTorch allows it, and so must compiled
calls (``model.compile()``, a model passed to a ``jm.compile``'d function). The
buffer's structure changes, so the program traces once more (with a reason in
``jm.compile_stats``); the buffer holds the concrete value after the call, and the
next call does not trace again. Compared with torch live.
"""

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jmodule as jm
from jmodule import nn

pytestmark = pytest.mark.torch

SEQ, DIM = 4, 3


def _model(lib, how="assign", persistent=True):
    """A causal mixer whose mask buffer is made on the first forward (lib: torch or jm)."""
    nn_ = lib.nn
    tril = torch.tril if lib is torch else jnp.tril
    ones = (lambda n: torch.ones(n, n)) if lib is torch else (lambda n: jnp.ones((n, n)))

    class Causal(nn_.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn_.Linear(DIM, DIM)
            self.register_buffer("mask", None, persistent=persistent)

        def forward(self, x):
            n = x.shape[-2]
            if self.mask is None:
                if how == "assign":
                    self.mask = tril(ones(n))
                else:
                    self.register_buffer("mask", tril(ones(n)), persistent=persistent)
            h = self.proj(x)
            return (self.mask[:n, :n] @ h).sum(-1)

    return Causal()


def _pair(how="assign", persistent=True):
    torch.manual_seed(0)
    t_model = _model(torch, how, persistent)
    j_model = _model(jm, how, persistent)
    j_model.proj.load_state_dict(
        {k: v.detach().numpy() for k, v in t_model.proj.state_dict().items()}
    )
    return t_model, j_model


X = np.linspace(-1, 1, 2 * SEQ * DIM, dtype=np.float32).reshape(2, SEQ, DIM)


def _check_buffer(t_model, j_model):
    assert type(j_model.mask).__name__ == "ArrayImpl"  # concrete, not a tracer
    np.testing.assert_array_equal(np.asarray(j_model.mask), t_model.mask.numpy())
    assert list(j_model.state_dict()) == list(t_model.state_dict())
    assert [n for n, _ in j_model.named_buffers()] == [n for n, _ in t_model.named_buffers()]


@pytest.mark.parametrize("how", ["assign", "register_buffer"])
def test_eager(how):
    t_model, j_model = _pair(how)
    want = t_model(torch.from_numpy(X)).detach().numpy()
    np.testing.assert_allclose(np.asarray(j_model(jnp.asarray(X))), want, rtol=1e-5, atol=1e-6)
    _check_buffer(t_model, j_model)


@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("how", ["assign", "register_buffer"])
def test_model_compile_traces_once_more_then_not_again(how, persistent):
    t_model, j_model = _pair(how, persistent)
    j_model.compile()
    want = t_model(torch.from_numpy(X)).detach().numpy()
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(j_model(jnp.asarray(X))), want, rtol=1e-5, atol=1e-6)
        _check_buffer(t_model, j_model)
    stats = jm.compile_stats(j_model)
    assert stats.num_traces == 2
    assert stats.reasons == ("first call", "buffer 'mask' was given a value (it was None)")


def test_jm_compile_training_step_as_torch():
    t_model, j_model = _pair()
    t_opt = torch.optim.SGD(t_model.parameters(), lr=0.1)
    j_opt = jm.optim.SGD(j_model.parameters(), lr=0.1)

    @jm.compile
    def step(model, opt, x):
        opt.zero_grad()
        loss = jm.backward(lambda: (model(x) ** 2).mean())
        opt.step()
        return loss

    for _ in range(3):
        t_opt.zero_grad()
        t_loss = (t_model(torch.from_numpy(X)) ** 2).mean()
        t_loss.backward()
        t_opt.step()
        j_loss = step(j_model, j_opt, jnp.asarray(X))
        np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-5)
        _check_buffer(t_model, j_model)
    for k, v in t_model.state_dict().items():
        np.testing.assert_allclose(
            np.asarray(j_model.state_dict()[k]), v.numpy(), rtol=1e-5, atol=1e-6
        )
    stats = jm.compile_stats(step)
    assert stats.num_traces == 2
    assert stats.reasons[1] == "buffer 'mask' of argument 0 was given a value (it was None)"


def test_compiled_model_inside_jm_backward_and_jm_compile():
    t_model, j_model = _pair()
    j_model.compile()
    t_loss = t_model(torch.from_numpy(X)).sum()
    j_loss = jm.backward(lambda: j_model(jnp.asarray(X)).sum())
    np.testing.assert_allclose(float(j_loss), t_loss.item(), rtol=1e-5, atol=1e-6)
    _check_buffer(t_model, j_model)

    t_model, j_model = _pair()
    j_model.compile()

    @jm.compile
    def forward(model, x):
        return model(x)

    for _ in range(2):
        np.testing.assert_allclose(
            np.asarray(forward(j_model, jnp.asarray(X))),
            t_model(torch.from_numpy(X)).detach().numpy(),
            rtol=1e-5,
            atol=1e-6,
        )
        _check_buffer(t_model, j_model)
    assert forward.num_traces == 2


def test_a_buffer_set_back_to_none_reuses_the_program_traced_for_none():
    _, j_model = _pair()
    j_model.compile()
    j_model(jnp.asarray(X))
    j_model(jnp.asarray(X))
    j_model.mask = None
    j_model(jnp.asarray(X))  # the first program (mask None, which it sets) again
    assert type(j_model.mask).__name__ == "ArrayImpl"
    j_model(jnp.asarray(X))
    assert jm.compile_stats(j_model).num_traces == 2


def test_a_buffer_set_to_none_between_calls_is_a_reason_too():
    _, j_model = _pair()
    j_model.mask = jnp.tril(jnp.ones((SEQ, SEQ)))
    j_model.compile()
    j_model(jnp.asarray(X))
    j_model.mask = None
    j_model(jnp.asarray(X))
    j_model(jnp.asarray(X))
    assert jm.compile_stats(j_model).reasons == ("first call", "buffer 'mask' was set to None")


def test_a_buffer_first_registered_in_a_compiled_forward_says_to_declare_it():
    class Late(nn.Module):
        def forward(self, x):
            if not hasattr(self, "scale"):
                self.register_buffer("scale", jnp.ones(x.shape[-1]))
            return x * self.scale

    class TorchLate(torch.nn.Module):
        def forward(self, x):
            if not hasattr(self, "scale"):
                self.register_buffer("scale", torch.ones(x.shape[-1]))
            return x * self.scale

    eager = Late()
    np.testing.assert_array_equal(
        np.asarray(eager(jnp.asarray(X))), TorchLate()(torch.from_numpy(X)).numpy()
    )
    model = Late()
    model.compile()
    with pytest.raises(jm.TracerLeakError, match=r"register_buffer\('scale', None\)"):
        model(jnp.asarray(X))
    assert "scale" not in model._buffers  # left unchanged
