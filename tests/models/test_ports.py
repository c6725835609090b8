"""Real PyTorch model files and their jmodule ports (``tests/models/ports/``), run side by side.

Each ``tests/models/ports/<name>_torch.py`` is a well-known PyTorch file written as
its repository has it; ``<name>_jm.py`` is the jmodule port, which changes
its imports to ``import jmodule.torch as torch`` (and ``torch.nn``, ...) and
``loss.backward()`` to ``jm.backward(closure)``, and as little else as it can
(``benchmarks/port_lines.py`` counts the lines). Its activations are
``jm.Tensor`` s, so the tests feed it ``torch.from_numpy`` of the port's own
``torch`` namespace. Both files are loaded by path, the jmodule model takes
the PyTorch model's ``state_dict()``, and in float64 (x64 on) the forward
outputs, the gradients of one backward and the running statistics agree to
1e-10, as do the LSTM language model's own ``main()`` (two epochs of its
``train()`` loop, ``evaluate()``, learning rate annealing) run from each
file, nanoGPT's AdamW step from its ``configure_optimizers`` (eager and
``jm.compile`` d) and its greedy ``generate``. The U-Net's ``train_model``
casts its images to float32 itself, so its loop is compared in float32.

The last test runs ``benchmarks/port_lines.py``'s counting on a small pair of
sources, so the published line counts cannot silently break.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _paths import ROOT
from _torch import torch

import jmodule as jm

PORTS = Path(__file__).parent / "ports"
TOL = 1e-10


def _load(path: Path, name: str):
    """Import a file by path as a fresh module (its module-level code runs again)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pair(stem: str):
    return _load(PORTS / f"{stem}_torch.py", f"{stem}_torch"), _load(
        PORTS / f"{stem}_jm.py", f"{stem}_jm"
    )


def _same_weights(ref, ours):
    """Load the torch module's state into the jmodule one; the keys and shapes must agree."""
    want = [(k, tuple(v.shape)) for k, v in ref.state_dict().items()]
    assert [(k, tuple(v.shape)) for k, v in ours.state_dict().items()] == want
    result = ours.load_state_dict({k: v.numpy() for k, v in ref.state_dict().items()})
    assert result.missing_keys == [] and result.unexpected_keys == []


def _close(got, want, tol=TOL, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=what)


def _grads_match(ref, ours, tol=TOL):
    named = dict(ours.named_parameters())
    assert sorted(named) == sorted(k for k, _ in ref.named_parameters())
    for k, p in ref.named_parameters():
        assert p.grad is not None and named[k].grad is not None, k
        assert float(p.grad.abs().max()) > 0, k  # every parameter is tested
        _close(named[k].grad, p.grad.numpy(), tol, f"grad of {k}")


def _state_match(ref, ours, tol=TOL):
    mine = ours.state_dict()
    for k, v in ref.state_dict().items():
        _close(np.asarray(mine[k]).astype(v.numpy().dtype), v.numpy(), tol, k)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


# ----------------------------------------------------------------------------- ViT


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_forward_and_gradients_match_torch_float64(x64, pool):
    t, j = _pair("vit")
    config = dict(
        image_size=8, patch_size=4, num_classes=5, dim=16, depth=2, heads=2, mlp_dim=32,
        dim_head=8, dropout=0.1, emb_dropout=0.1, pool=pool,
    )  # fmt: skip
    torch.manual_seed(0)
    ref = t.ViT(**config).double()
    ours = j.ViT(**config).to(jm.float64)
    _same_weights(ref, ours)
    assert repr(ours) == repr(ref)
    ref.eval()  # dropout is identity in eval mode; PyTorch's and JAX's masks differ
    ours.eval()
    rng = np.random.default_rng(0)
    img = rng.standard_normal((3, 3, 8, 8))
    labels = rng.integers(0, 5, 3)

    want = ref(torch.from_numpy(img))
    got = ours(j.torch.from_numpy(img))
    assert type(got) is jm.Tensor and got.dtype == jnp.float64
    _close(got, want.detach().numpy(), what="logits")

    want_loss = torch.nn.functional.cross_entropy(want, torch.from_numpy(labels))
    want_loss.backward()
    loss = jm.backward(
        lambda: j.nn.functional.cross_entropy(
            ours(j.torch.from_numpy(img)), j.torch.from_numpy(labels)
        )
    )
    _close(loss, want_loss.item(), what="loss")
    _grads_match(ref, ours)


# ----------------------------------------------------------------------------- LSTM LM


@pytest.mark.slow
@pytest.mark.torch
def test_lstm_lm_forward_and_gradients_match_torch_float64(x64):
    t, j = _pair("lstm_lm")
    ref, ours = t.model.double(), j.model.to(jm.float64)
    _same_weights(ref, ours)
    assert repr(ours) == repr(ref)
    ref.eval()
    ours.eval()
    data, targets = t.get_batch(t.train_data, 0)
    jdata, jtargets = j.get_batch(j.train_data, 0)
    assert type(jdata) is jm.Tensor  # batchify of torch.from_numpy, as in the original
    np.testing.assert_array_equal(np.asarray(jdata), data.numpy())
    np.testing.assert_array_equal(np.asarray(jtargets), targets.numpy())

    hidden = ref.init_hidden(t.args.batch_size)
    jhidden = ours.init_hidden(j.args.batch_size)
    assert jhidden[0].dtype == jnp.float64 and hidden[0].dtype == torch.float64
    output, (h, c) = ref(data, hidden)
    loss = t.criterion(output, targets)
    loss.backward()

    def closure():
        result = ours(jdata, jhidden)
        return j.criterion(result[0], jtargets), result

    got, (output_, (h_, c_)) = jm.backward(closure, has_aux=True)
    assert type(output_) is jm.Tensor and type(h_) is jm.Tensor
    _close(got, loss.item(), what="loss")
    _close(output_, output.detach().numpy(), what="log-probabilities")
    _close(h_, h.detach().numpy(), what="h")
    _close(c_, c.detach().numpy(), what="c")
    _grads_match(ref, ours)


@pytest.mark.slow
@pytest.mark.torch
def test_lstm_lm_training_script_matches_torch_float64(x64, capsys):
    """The file's own ``main()``: two epochs of ``train()`` (truncated BPTT with the hidden
    state carried over, ``clip_grad_norm_``, the hand-written SGD step at lr 20),
    ``evaluate()`` after each, the best state kept and reloaded, the test loss."""
    t, j = _pair("lstm_lm")
    args = dict(
        rnn_type="LSTM", ntoken=t.ntokens, ninp=t.args.emsize, nhid=t.args.nhid,
        nlayers=t.args.nlayers, dropout=0.0,  # train mode: PyTorch's masks are not JAX's
    )  # fmt: skip
    t.model = t.RNNModel(**args).double()
    j.model = j.RNNModel(**args).to(jm.float64)
    _same_weights(t.model, j.model)
    start = {k: v.clone() for k, v in t.model.state_dict().items()}
    losses = {}
    for name, mod in (("torch", t), ("jm", j)):
        criterion, seen = mod.criterion, losses.setdefault(name, [])

        def recording(output, targets, criterion=criterion, seen=seen):
            loss = criterion(output, targets)
            seen.append(loss.item() if isinstance(loss, torch.Tensor) else float(loss))
            return loss

        mod.criterion = recording
    test_loss = t.main()
    printed = capsys.readouterr().out
    got = j.main()
    assert capsys.readouterr().out.count("| epoch") == printed.count("| epoch") > 0

    n_train = len(range(0, t.train_data.size(0) - 1, t.args.bptt))
    assert len(losses["torch"]) > 2 * n_train  # train and evaluate, both epochs
    _close(losses["jm"], losses["torch"], what="every loss the criterion computed")
    assert max(float((v - start[k]).abs().max()) for k, v in t.model.state_dict().items()) > 0.1
    _close(got, test_loss, what="test loss")
    assert j.lr == t.lr and j.best_val_loss == pytest.approx(t.best_val_loss, rel=TOL)
    _state_match(t.model, j.model)


# ----------------------------------------------------------------------------- U-Net

UNET_SHAPE = (2, 3, 36, 44)  # odd sizes on the way down: Up's F.pad pads by one


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("bilinear", [False, True], ids=["transposed", "bilinear"])
def test_unet_forward_gradients_and_running_stats_match_torch_float64(x64, bilinear):
    """Train mode (batch statistics): the output and the running statistics it leaves, and
    for the default ``ConvTranspose2d`` U-Net every parameter's gradient. (For the
    bilinear one that would double the compile time: its ``Up`` lines are the same
    and ``nn.Upsample``'s gradient is tested elsewhere. Eval mode runs in
    ``evaluate()``, in the training-loop test below.)"""
    t, j = _pair("unet")
    torch.manual_seed(0)
    ref = t.UNet(n_channels=3, n_classes=2, bilinear=bilinear).double()
    ours = j.UNet(n_channels=3, n_classes=2, bilinear=bilinear).to(jm.float64)
    _same_weights(ref, ours)
    assert repr(ours) == repr(ref)
    rng = np.random.default_rng(0)
    img = rng.standard_normal(UNET_SHAPE)
    cot = rng.standard_normal((UNET_SHAPE[0], 2, *UNET_SHAPE[2:]))

    want = ref(torch.from_numpy(img))
    if bilinear:
        _close(ours(j.torch.from_numpy(img)), want.detach().numpy(), what="train-mode logits")
    else:
        (want * torch.from_numpy(cot)).sum().backward()
        got = jm.backward(lambda: (ours(j.torch.from_numpy(img)) * j.torch.from_numpy(cot)).sum())
        _close(got, (want * torch.from_numpy(cot)).sum().item(), what="loss")
        _grads_match(ref, ours)
    _state_match(ref, ours)  # the running statistics moved the same way


def _small_segmenter(module, n_classes):
    """``train.py``'s loop runs on any model with ``n_channels`` and ``n_classes``: this one is
    two of the file's own layers (the whole U-Net is compared above; here its many
    shapes would only add compile time)."""
    model = module.nn.Sequential(module.DoubleConv(3, 4), module.OutConv(4, n_classes))
    model.n_channels, model.n_classes = 3, n_classes
    return model


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("n_classes", [3, 1], ids=["softmax", "sigmoid"])
@pytest.mark.filterwarnings("ignore:Explicitly requested dtype int64:UserWarning")
def test_unet_train_model_matches_torch_float32(n_classes):
    """``train.py``'s loop from each file: RMSprop with momentum, cross-entropy (or BCE) plus
    the Dice loss, ``GradScaler`` (disabled, as on CPU), ``clip_grad_norm_``, then
    ``evaluate.py``'s Dice score and ``ReduceLROnPlateau``, for two epochs. The loop
    casts the images to float32 itself, so float32 tolerances."""
    t, j = _pair("unet")
    torch.manual_seed(0)
    ref, ours = _small_segmenter(t, n_classes), _small_segmenter(j, n_classes)
    _same_weights(ref, ours)
    start = {k: v.clone() for k, v in ref.state_dict().items()}
    classes, size = max(n_classes, 2), (12, 10)
    run = dict(epochs=2, learning_rate=1e-3)
    want_losses, want_scores = t.train_model(
        ref,
        torch.device("cpu"),
        t.synthetic_loader(3, 2, 3, classes, size),
        t.synthetic_loader(2, 2, 3, classes, size, seed=1),
        **run,
    )
    losses, scores = j.train_model(
        ours,
        j.torch.device("cpu"),
        j.synthetic_loader(3, 2, 3, classes, size),
        j.synthetic_loader(2, 2, 3, classes, size, seed=1),
        **run,
    )
    assert len(losses) == len(want_losses) == 6 and len(scores) == 2
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-6)
    assert max(scores) > 0.05  # a Dice score that can differ
    moved = max(float((v - start[k]).abs().max()) for k, v in ref.state_dict().items())
    assert moved > 1e-2  # RMSprop moved the weights: their comparison means something
    _state_match(ref, ours, tol=1e-5)


# ----------------------------------------------------------------------------- nanoGPT

GPT_CONFIG = dict(block_size=8, vocab_size=32, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
OPTIM_ARGS = dict(weight_decay=0.1, learning_rate=1e-2, betas=(0.9, 0.95), device_type="cpu")


def _gpt_pair(t, j, bias):
    """The two ``GPT`` s in float64 with the torch one's weights; the token embedding stays
    tied to ``lm_head`` (its one Parameter takes both state-dict entries)."""
    torch.manual_seed(0)
    ref = t.GPT(t.GPTConfig(**GPT_CONFIG, bias=bias)).double()
    ours = j.GPT(j.GPTConfig(**GPT_CONFIG, bias=bias)).to(j.torch.float64)
    _same_weights(ref, ours)
    assert repr(ours) == repr(ref)
    assert ours.transformer.wte.weight is ours.lm_head.weight
    return ref, ours


def _tokens(shape, seed):
    return np.random.default_rng(seed).integers(0, GPT_CONFIG["vocab_size"], shape)


def _gpt_backward(t, j, ref, ours, idx, targets, compiled=False):
    """``model(idx, targets)``'s logits and loss, and every parameter's gradient, compared
    (the jmodule side eagerly, or as one ``jm.compile`` d program)."""
    want, want_loss = ref(torch.from_numpy(idx), torch.from_numpy(targets))
    want_loss.backward()

    def forward_backward(model, x, y):
        def closure():
            logits, loss = model(x, y)
            return loss, logits

        return jm.backward(closure, has_aux=True)

    run = jm.compile(forward_backward) if compiled else forward_backward
    loss, got = run(ours, j.torch.from_numpy(idx), j.torch.from_numpy(targets))
    assert type(got) is jm.Tensor and got.dtype == jnp.float64
    _close(got, want.detach().numpy(), what="logits")
    _close(loss, want_loss.item(), what="loss")
    _grads_match(ref, ours)
    return loss


@pytest.mark.slow
@pytest.mark.torch
def test_nanogpt_matches_torch_float64(x64, capsys):
    """The flash path (``F.scaled_dot_product_attention``), biases on: the last position's
    logits without targets; logits, loss and gradients with them; one AdamW step from
    ``configure_optimizers`` (two parameter groups); and that step ``jm.compile`` d, from
    the same start, equal to it."""
    t, j = _pair("nanogpt")
    ref, ours = _gpt_pair(t, j, bias=True)
    assert ours.transformer.h[0].attn.flash and ref.transformer.h[0].attn.flash
    assert ours.get_num_params() == ref.get_num_params()
    assert ours.estimate_mfu(4, dt=0.5) == pytest.approx(ref.estimate_mfu(4, dt=0.5), rel=TOL)
    start = {k: v.numpy().copy() for k, v in ref.state_dict().items()}
    idx, targets = _tokens((2, 8), 0), _tokens((2, 8), 1)

    want, no_loss = ref(torch.from_numpy(idx))
    got, also_no_loss = ours(j.torch.from_numpy(idx))
    assert no_loss is None and also_no_loss is None and got.shape == (2, 1, 32)
    _close(got, want.detach().numpy(), what="last-position logits")

    eager_loss = _gpt_backward(t, j, ref, ours, idx, targets)
    want_opt = ref.configure_optimizers(**OPTIM_ARGS)
    opt = ours.configure_optimizers(**OPTIM_ARGS)
    groups = [(len(g["params"]), g["weight_decay"]) for g in want_opt.param_groups]
    assert [(len(g["params"]), g["weight_decay"]) for g in opt.param_groups] == groups
    assert [wd for _, wd in groups] == [0.1, 0.0] and min(n for n, _ in groups) > 0
    want_opt.step()
    opt.step()
    _state_match(ref, ours)
    assert capsys.readouterr().out.count("using fused AdamW: False") == 2

    compiled = j.GPT(j.GPTConfig(**GPT_CONFIG, bias=True)).to(j.torch.float64)
    compiled.load_state_dict(start)
    compiled_opt = compiled.configure_optimizers(**OPTIM_ARGS)

    @jm.compile
    def train_step(model, optimizer, x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = jm.backward(lambda: model(x, y)[1])
        optimizer.step()
        return loss

    x, y = j.torch.from_numpy(idx), j.torch.from_numpy(targets)
    _close(train_step(compiled, compiled_opt, x, y), eager_loss, what="compiled step's loss")
    assert compiled.transformer.wte.weight is compiled.lm_head.weight
    eager = ours.state_dict()
    for k, v in compiled.state_dict().items():
        _close(v, eager[k], what=f"{k} after the compiled step")


@pytest.mark.slow
@pytest.mark.torch
def test_nanogpt_manual_attention_crop_and_generate_match_torch_float64(x64, monkeypatch):
    """Without ``F.scaled_dot_product_attention`` (PyTorch < 2.0) the file's own ``__init__``
    takes the manual path and registers the causal ``bias`` buffer; biases off (``LayerNorm``
    without one). Logits, loss and gradients (``jm.compile`` d here, eager above); then
    ``crop_block_size`` and ``generate`` past the new block size, with ``top_k=1`` (greedy:
    torch's tokens) and with ``top_k=5``."""
    t, j = _pair("nanogpt")
    for functional in (torch.nn.functional, j.F):
        monkeypatch.delattr(functional, "scaled_dot_product_attention")
    ref, ours = _gpt_pair(t, j, bias=False)
    monkeypatch.undo()
    assert not ours.transformer.h[0].attn.flash and not ref.transformer.h[0].attn.flash
    assert "transformer.h.1.attn.bias" in ours.state_dict()
    assert ours.transformer.ln_f.bias is None
    _gpt_backward(t, j, ref, ours, _tokens((2, 8), 2), _tokens((2, 8), 3), compiled=True)

    ref.crop_block_size(4)
    ours.crop_block_size(4)
    assert ours.config.block_size == 4 and ours.transformer.wpe.weight.shape == (4, 16)
    assert ours.transformer.h[1].attn.bias.shape == (1, 1, 4, 4)
    ref.eval()
    ours.eval()
    prompt = _tokens((2, 4), 4)
    want, _ = ref(torch.from_numpy(prompt))
    got, _ = ours(j.torch.from_numpy(prompt))
    _close(got, want.detach().numpy(), what="last-position logits after crop_block_size")
    want = ref.generate(torch.from_numpy(prompt), 3, top_k=1)
    got = ours.generate(j.torch.from_numpy(prompt), 3, top_k=1)
    assert type(got) is jm.Tensor and got.shape == (2, 7)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
    sampled = ours.generate(j.torch.from_numpy(prompt), 3, temperature=0.8, top_k=5)
    assert sampled.shape == (2, 7) and 0 <= int(sampled.min()) <= int(sampled.max()) < 32


# ----------------------------------------------------------------------------- ResNet


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("variant", ["resnet18", "bottleneck"])
def test_resnet_forward_gradients_and_running_stats_match_torch_float64(x64, variant):
    """Train mode (batch statistics): the logits, every parameter's gradient and the
    running statistics, for ``resnet18`` and for a one-block-per-stage ``Bottleneck``
    ResNet at an eighth of the width (``width_per_group=8``) with the last two strides
    replaced by dilation, both at 4x3x32x32. Batch 4, not 2: at 2x3x32x32 ``layer4``'s
    batch norms normalise two values each, and the answer is ill-conditioned (inputs
    moved by 1e-15 of themselves move torch's own gradients by 1.4e-10); at batch 4 by
    2e-13, so 1e-10 measures jmodule, not rounding. The jmodule forward and backward run as one
    ``jm.compile`` d program: eagerly each of its ops would compile on its own, too
    quickly to be cached, every run (the eager path of the same layers is the U-Net's)."""
    t, j = _pair("resnet")
    config = {"num_classes": 10}
    if variant == "bottleneck":
        config.update(width_per_group=8, replace_stride_with_dilation=[False, True, True])
    build = {"resnet18": lambda m: m.resnet18(**config)}.get(
        variant, lambda m: m.ResNet(m.Bottleneck, [1, 1, 1, 1], **config)
    )
    torch.manual_seed(0)
    ref, ours = build(t).double(), build(j).to(j.torch.float64)
    _same_weights(ref, ours)
    assert repr(ours) == repr(ref)
    rng = np.random.default_rng(0)
    img, cot = rng.standard_normal((4, 3, 32, 32)), rng.standard_normal((4, 10))

    want = ref(torch.from_numpy(img))
    (want * torch.from_numpy(cot)).sum().backward()

    @jm.compile
    def forward_backward(model, x, c):
        def closure():
            out = model(x)
            return (out * c).sum(), out

        return jm.backward(closure, has_aux=True)

    loss, got = forward_backward(ours, j.torch.from_numpy(img), j.torch.from_numpy(cot))
    assert type(got) is jm.Tensor
    _close(got, want.detach().numpy(), what="train-mode logits")
    _close(loss, (want * torch.from_numpy(cot)).sum().item(), what="loss")
    _grads_match(ref, ours)
    _state_match(ref, ours)  # the running statistics moved the same way


@pytest.mark.slow
def test_resnet_init_matches_torchvision():
    """The file's own init: Kaiming-normal convolutions (``fan_out``), BN weights one and
    biases zero, and with ``zero_init_residual`` each block's last BN weight zero."""
    j = _load(PORTS / "resnet_jm.py", "resnet_jm")  # the port alone: no PyTorch needed
    model = j.ResNet(j.BasicBlock, [1, 1, 1, 1], num_classes=10, zero_init_residual=True)
    conv = model.layer4[0].conv1.weight
    std = (2.0 / (conv.shape[0] * 9)) ** 0.5  # kaiming_normal_, fan_out, relu
    assert float(np.std(np.asarray(conv))) == pytest.approx(std, rel=0.05)
    assert float(np.abs(np.asarray(model.layer1[0].bn1.weight) - 1).max()) == 0
    assert float(np.abs(np.asarray(model.layer1[0].bn1.bias)).max()) == 0
    for block in (model.layer1[0], model.layer4[0]):
        assert float(np.abs(np.asarray(block.bn2.weight)).max()) == 0


# ----------------------------------------------------------------------------- line counts


def test_port_lines_counts_and_classifies_a_small_pair(capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import port_lines
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    torch_src = '''"""The original."""

import torch
from torch import nn


class Net(nn.Module):
    def forward(self, x, y):
        h = x.view(x.size(0), -1)
        z = torch.cat([h, y], dim=1)
        loss = z.sum()
        loss.backward()
        w = z * 2
        return w

    def step(self, x):
        # a comment
        out = self(x, x)
        return out

    def run(self, x):
        y = self.step(
            x.float(),
        )
        return y
'''
    jm_src = '''"""The port: its docstring differs and is not counted."""

import jmodule as jm
from jmodule import nn


class Net(nn.Module):
    def forward(self, x, y):
        h = x.reshape(x.shape[0], -1)  # port: .view

        z = jm.cat([h, y], dim=1)
        loss = jm.backward(lambda: z.sum())  # port: closure
        w = z * 2
        print("added")
        return w

    def step(self, x):
        # another comment
        if True:
            out = self(x, x)
        return out

    def run(self, x):
        with jm.no_grad():
            y = self.step(
                x.float(),
            )
        return y
'''
    result = port_lines.count_changes(torch_src, jm_src)
    assert result["model_lines"] == 18  # code lines of the original, docstring left out
    assert result["classes"] == {
        "imports": 2,
        "namespace": 1,
        "indentation": 4,
        "backward/optimizer": 2,
        "tensor method": 1,
        "other": 1,
    }
    assert result["changed_lines"] == 11
    kinds = {line.strip(): kind for kind, line in result["lines"]}
    assert kinds == {
        "import torch": "imports",
        "from torch import nn": "imports",
        "h = x.view(x.size(0), -1)": "tensor method",
        "z = torch.cat([h, y], dim=1)": "namespace",
        "loss = z.sum()": "backward/optimizer",
        "loss.backward()": "backward/optimizer",
        '+ print("added")': "other",
        "out = self(x, x)": "indentation",
        "y = self.step(": "indentation",
        "x.float(),": "indentation",
        ")": "indentation",  # a line of brackets: its statement moved as a whole
    }
    rows = port_lines.count_dir(PORTS)
    assert {r["model"] for r in rows} >= {"vit", "lstm_lm", "unet", "nanogpt", "resnet"}
    assert all(0 < r["changed_lines"] < r["model_lines"] for r in rows)
    table = port_lines.markdown(rows)
    assert table.splitlines()[0].startswith("| model | model lines | changed | % |")
    assert len(table.splitlines()) == 2 + len(rows) + 1  # header, rule, rows, total
    assert port_lines.main(["--json", str(PORTS)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["changed_lines"] for r in printed] == [r["changed_lines"] for r in rows]
