"""ScriptModule.code re-executes to forward's output, for every layer jm.nn exports.

The layer list is built from what ``jm.nn`` exports when the tests run: each
Module subclass is constructed from the table below, or else from the layer
parity registries (``CASES`` in tests/nn/layers/test_layers_*.py), or else from a few
generic constructions (``cls()``, ``cls(4)``, ``cls(4, 4)``, ...) whose eager
forward runs. For each layer, in training and in eval mode, the rendered code
must parse, and executing it on a copy of the module must give the eager
output and leave the same state (BatchNorm statistics, the generator's key).
"""

from __future__ import annotations

import ast
import copy
import glob
import importlib
import inspect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import pytest
from _paths import TESTS

import jmodule as jm
import jmodule.jit
from jmodule import nn

Inputs = Callable[[np.random.Generator], tuple]


def f(*shape: int) -> Inputs:
    return lambda rng: (rng.standard_normal(shape).astype(np.float32),)


def fs(*shapes: tuple[int, ...]) -> Inputs:
    return lambda rng: tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


def ints(high: int, *shape: int) -> Inputs:
    return lambda rng: (rng.integers(0, high, shape).astype(np.int32),)


def probs_and_targets(rng: np.random.Generator) -> tuple:
    return rng.uniform(0.05, 0.95, (3, 4)).astype(np.float32), rng.uniform(0, 1, (3, 4)).astype(
        np.float32
    )


def logits_and_classes(rng: np.random.Generator) -> tuple:
    return rng.standard_normal((3, 5)).astype(np.float32), rng.integers(0, 5, (3,)).astype(np.int32)


def pair_and_signs(shape: tuple[int, ...], target: tuple[int, ...]) -> Inputs:
    def make(rng: np.random.Generator) -> tuple:
        a = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape).astype(np.float32)
        return a, b, np.sign(rng.standard_normal(target)).astype(np.float32)

    return make


def ctc_inputs(rng: np.random.Generator) -> tuple:
    logits = rng.standard_normal((6, 2, 4)).astype(np.float32)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    targets = rng.integers(1, 4, (2, 3)).astype(np.int32)
    return log_probs, targets, np.array([6, 5], np.int32), np.array([3, 2], np.int32)


@dataclass
class Case:
    """One layer configuration: constructor and example inputs."""

    name: str
    make: Callable[[], nn.Module]
    inputs: Inputs
    call_kwargs: dict = field(default_factory=dict)
    source: str = "table"

    def example(self) -> tuple:
        return tuple(jax.numpy.asarray(x) for x in self.inputs(np.random.default_rng(0)))


def _c(name: str, *args: Any, inputs: Inputs, **kwargs: Any) -> Case:
    return Case(name, lambda: getattr(nn, name)(*args, **kwargs), inputs)


def _flax_linear() -> nn.Module:
    from flax import nnx

    return nn.FlaxModule(nnx.Linear(6, 3, rngs=nnx.Rngs(0)))


X = f(4, 6)
IMG = f(2, 3, 6, 6)
SEQ = f(2, 3, 8)
VOL = f(1, 2, 4, 4, 4)

TABLE = [
    _c("Linear", 6, 4, inputs=f(3, 6)),
    _c("Bilinear", 3, 4, 5, inputs=fs((2, 3), (2, 4))),
    _c("Identity", inputs=X),
    _c("Flatten", inputs=f(2, 3, 4)),
    _c("Unflatten", 1, (2, 3), inputs=f(2, 6)),
    *[
        _c(name, inputs=X)
        for name in (
            "ReLU ReLU6 LeakyReLU ELU CELU SELU GELU SiLU Mish Sigmoid Tanh Hardtanh "
            "Hardsigmoid Hardswish Hardshrink Softshrink Tanhshrink Softsign Softplus "
            "LogSigmoid PReLU RReLU"
        ).split()
    ],
    _c("Threshold", 0.1, 20.0, inputs=X),
    _c("GLU", inputs=X),
    _c("Softmax", 1, inputs=X),
    _c("Softmin", 1, inputs=X),
    _c("LogSoftmax", 1, inputs=X),
    _c("Softmax2d", inputs=IMG),
    _c("Dropout", 0.5, inputs=X),
    _c("Dropout1d", 0.5, inputs=SEQ),
    _c("Dropout2d", 0.5, inputs=IMG),
    _c("Dropout3d", 0.5, inputs=VOL),
    _c("AlphaDropout", 0.5, inputs=X),
    _c("FeatureAlphaDropout", 0.5, inputs=IMG),
    _c("BatchNorm1d", 6, inputs=X),
    _c("BatchNorm2d", 3, inputs=IMG),
    _c("BatchNorm3d", 2, inputs=VOL),
    _c("SyncBatchNorm", 3, inputs=IMG),
    _c("GroupNorm", 2, 4, inputs=f(2, 4, 5)),
    _c("InstanceNorm1d", 3, inputs=SEQ),
    _c("InstanceNorm2d", 3, affine=True, track_running_stats=True, inputs=IMG),
    _c("InstanceNorm3d", 2, inputs=VOL),
    _c("LayerNorm", 8, inputs=SEQ),
    _c("RMSNorm", 8, inputs=SEQ),
    _c("LocalResponseNorm", 2, inputs=IMG),
    _c("Conv1d", 3, 4, 3, inputs=SEQ),
    _c("Conv2d", 3, 4, 3, padding=1, inputs=IMG),
    _c("Conv3d", 2, 3, 2, inputs=VOL),
    _c("ConvTranspose1d", 3, 4, 3, stride=2, inputs=SEQ),
    _c("ConvTranspose2d", 3, 4, 3, inputs=IMG),
    _c("ConvTranspose3d", 2, 3, 2, inputs=VOL),
    _c("MaxPool1d", 2, inputs=SEQ),
    _c("MaxPool2d", 2, inputs=IMG),
    _c("MaxPool3d", 2, inputs=VOL),
    _c("AvgPool1d", 2, inputs=SEQ),
    _c("AvgPool2d", 3, stride=2, padding=1, inputs=IMG),
    _c("AvgPool3d", 2, inputs=VOL),
    _c("AdaptiveAvgPool1d", 3, inputs=SEQ),
    _c("AdaptiveAvgPool2d", (2, 3), inputs=IMG),
    _c("AdaptiveAvgPool3d", 2, inputs=VOL),
    _c("AdaptiveMaxPool1d", 3, inputs=SEQ),
    _c("AdaptiveMaxPool2d", 2, inputs=IMG),
    _c("AdaptiveMaxPool3d", 2, inputs=VOL),
    _c("ConstantPad1d", 2, 1.5, inputs=SEQ),
    _c("ConstantPad2d", (1, 2, 0, 1), 0.5, inputs=IMG),
    _c("ConstantPad3d", 1, 2.0, inputs=VOL),
    _c("ZeroPad1d", 2, inputs=SEQ),
    _c("ZeroPad2d", 1, inputs=IMG),
    _c("ZeroPad3d", 1, inputs=VOL),
    _c("ReflectionPad1d", 2, inputs=SEQ),
    _c("ReflectionPad2d", 2, inputs=IMG),
    _c("ReflectionPad3d", 1, inputs=VOL),
    _c("ReplicationPad1d", 2, inputs=SEQ),
    _c("ReplicationPad2d", 2, inputs=IMG),
    _c("ReplicationPad3d", 1, inputs=VOL),
    _c("CircularPad1d", 2, inputs=SEQ),
    _c("CircularPad2d", 2, inputs=IMG),
    _c("CircularPad3d", 1, inputs=VOL),
    _c("PixelShuffle", 2, inputs=f(1, 8, 3, 3)),
    _c("PixelUnshuffle", 2, inputs=f(1, 2, 4, 4)),
    _c("ChannelShuffle", 2, inputs=f(1, 4, 2, 2)),
    _c("Upsample", scale_factor=2, inputs=IMG),
    _c("Upsample", scale_factor=2, mode="bilinear", inputs=IMG),
    _c("UpsamplingNearest2d", scale_factor=2, inputs=IMG),
    _c("UpsamplingBilinear2d", scale_factor=2, inputs=IMG),
    _c("Embedding", 10, 4, inputs=ints(10, 2, 3)),
    _c("EmbeddingBag", 10, 4, inputs=ints(10, 2, 3)),
    _c("RNN", 4, 5, inputs=f(3, 2, 4)),
    _c("LSTM", 4, 5, num_layers=2, inputs=f(3, 2, 4)),
    _c("GRU", 4, 5, batch_first=True, bidirectional=True, inputs=f(2, 3, 4)),
    _c("RNNCell", 4, 5, inputs=f(2, 4)),
    _c("LSTMCell", 4, 5, inputs=f(2, 4)),
    _c("GRUCell", 4, 5, inputs=f(2, 4)),
    _c("MultiheadAttention", 8, 2, inputs=fs((3, 2, 8), (4, 2, 8), (4, 2, 8))),
    _c(
        "TransformerEncoderLayer",
        8,
        2,
        dim_feedforward=16,
        dropout=0.0,
        batch_first=True,
        inputs=SEQ,
    ),
    _c(
        "TransformerDecoderLayer",
        8,
        2,
        dim_feedforward=16,
        dropout=0.0,
        batch_first=True,
        inputs=fs((2, 3, 8), (2, 4, 8)),
    ),
    Case(
        "TransformerEncoder",
        lambda: nn.TransformerEncoder(
            nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True), 2
        ),
        SEQ,
    ),
    Case(
        "TransformerDecoder",
        lambda: nn.TransformerDecoder(
            nn.TransformerDecoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True), 2
        ),
        fs((2, 3, 8), (2, 4, 8)),
    ),
    _c(
        "Transformer",
        d_model=8,
        nhead=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dim_feedforward=16,
        dropout=0.0,
        batch_first=True,
        inputs=fs((2, 3, 8), (2, 4, 8)),
    ),
    _c("MSELoss", inputs=fs((3, 4), (3, 4))),
    _c("L1Loss", inputs=fs((3, 4), (3, 4))),
    _c("SmoothL1Loss", inputs=fs((3, 4), (3, 4))),
    _c("HuberLoss", inputs=fs((3, 4), (3, 4))),
    _c("BCELoss", inputs=probs_and_targets),
    _c("BCEWithLogitsLoss", inputs=probs_and_targets),
    _c("CrossEntropyLoss", inputs=logits_and_classes),
    _c("NLLLoss", inputs=logits_and_classes),
    _c("KLDivLoss", reduction="batchmean", inputs=fs((3, 4), (3, 4))),
    _c("MarginRankingLoss", inputs=pair_and_signs((5,), (5,))),
    _c("CosineEmbeddingLoss", inputs=pair_and_signs((3, 4), (3,))),
    _c("TripletMarginLoss", inputs=fs((3, 4), (3, 4), (3, 4))),
    _c("CTCLoss", inputs=ctc_inputs),
    _c("CosineSimilarity", inputs=fs((3, 4), (3, 4))),
    _c("PairwiseDistance", inputs=fs((3, 4), (3, 4))),
    Case("FlaxModule", lambda: _flax_linear(), X),
    Case(
        "Sequential",
        lambda: nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)),
        X,
    ),
]

#: Exported classes with no forward of their own (bases and containers).
NOT_LAYERS = {"Module", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict"}

#: What every run must cover, whatever else jm.nn exports.
REQUIRED = {"Linear", "BatchNorm1d", "ReLU", "Dropout", "Identity", "Sequential"}


def _exported_layers() -> list[str]:
    names = []
    for name in dir(nn):
        obj = getattr(nn, name)
        if inspect.isclass(obj) and issubclass(obj, nn.Module) and name not in NOT_LAYERS:
            if obj.forward is not nn.Module.forward:
                names.append(name)
    return sorted(names)


def _registry_cases() -> dict[str, Case]:
    """The first case of each layer in the parity registries (tests/nn/layers/test_layers_*.py)."""
    found: dict[str, Case] = {}
    try:
        from layer_harness import _jm_args
    except ImportError:
        return found
    layers = str(TESTS / "nn" / "layers")
    if layers not in sys.path:  # this module's worker may not have collected them
        sys.path.insert(0, layers)
    for path in sorted(glob.glob(os.path.join(layers, "test_layers*.py"))):
        try:
            module = importlib.import_module(os.path.basename(path)[:-3])
        except Exception:  # a registry being edited does not stop this test
            continue
        for case in getattr(module, "CASES", ()):
            if case.name in found:
                continue

            def make(case: Any = case) -> nn.Module:
                return getattr(nn, case.name)(*_jm_args(case.args), **_jm_args(case.kwargs))

            found[case.name] = Case(
                case.name, make, case.inputs, dict(case.call_kwargs), "registry"
            )
    return found


_GENERIC_ARGS = [(), (4,), (4, 4), (4, 4, 3), (2, 4)]
_GENERIC_INPUTS = [f(2, 4), f(2, 4, 6), f(2, 4, 6, 6), f(1, 4, 4, 4, 4), fs((2, 4), (2, 4))]


def _runs_eagerly(case: Case) -> bool:
    try:
        case.make()(*case.example(), **case.call_kwargs)
    except Exception:
        return False
    return True


def _generic_case(name: str) -> Case | None:
    for args in _GENERIC_ARGS:
        for inputs in _GENERIC_INPUTS:
            case = Case(name, lambda args=args: getattr(nn, name)(*args), inputs, source="generic")
            if _runs_eagerly(case):
                return case
    return None


def _cases() -> list[Case]:
    table = {c.name for c in TABLE}
    cases = [c for c in TABLE if hasattr(nn, c.name)]
    registry = None
    for name in _exported_layers():
        if name in table:
            continue
        if registry is None:
            registry = _registry_cases()
        case = registry.get(name)
        if case is None or not _runs_eagerly(case):
            case = _generic_case(name)
        if case is not None:
            cases.append(case)
    return cases


CASES = _cases()


def _ids(case: Case) -> str:
    return f"{case.name}-{case.source}" if case.source != "table" else case.name


def _assert_same(got: Any, want: Any, what: str) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want), what
    for i, (a, b) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want))):
        assert np.shape(a) == np.shape(b), f"{what}[{i}]"
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            np.asarray(b, np.float64),
            rtol=2e-5,
            atol=2e-6,
            err_msg=f"{what}[{i}]",
        )


def _state(model: nn.Module) -> dict[str, Any]:
    """Everything the code reads, by name: parameters, buffers and the generator's key."""
    state = {n: p.data for n, p in model.named_parameters()}
    state.update(dict(model.named_buffers()))
    state[jm.jit.ops.RNG_KEY] = jm.random.default_generator.get_state()
    return state


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=[_ids(c) for c in CASES])
def test_code_reexecutes_to_forward_output(case):
    # The code runs under jax.jit over a dict of state (one compilation, not one per
    # operation); the reference is the module's own forward, compiled as model.compile()
    # does (which the layer parity tests hold to the eager forward).
    inputs = case.example()
    for training in (True, False):
        jm.manual_seed(0)
        model = case.make().train(training)
        sm = jm.jit.trace(model, inputs, example_kwarg_inputs=case.call_kwargs or None)
        code, constants = sm.code_with_constants
        ast.parse(code)
        namespace = {"CONSTANTS": constants}
        exec(compile(code, f"<code of {case.name}>", "exec"), namespace)
        forward = namespace["forward"]

        @jax.jit
        def run(state, args, forward=forward):
            out = forward(state, *args, **case.call_kwargs)
            return out, state

        reference = copy.deepcopy(model)
        reference.compile()
        jm.manual_seed(5)
        state = _state(model)
        want = reference(*inputs, **case.call_kwargs)
        got, new_state = run(state, inputs)
        mode = "train" if training else "eval"
        _assert_same(got, want, f"{case.name} ({mode}) output")
        want_state = _state(reference)
        assert set(new_state) == set(want_state)
        for k in want_state:
            _assert_same(new_state[k], want_state[k], f"{case.name} ({mode}) {k}")


@pytest.mark.slow
def test_code_runs_eagerly_on_the_module_itself():
    # The other way to run it: op by op, on the module, updating its buffers in place.
    model = nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.3))
    x = jax.numpy.asarray(f(4, 6)(np.random.default_rng(0))[0])
    code, constants = jm.jit.trace(model, x).code_with_constants
    namespace = {"CONSTANTS": constants}
    exec(code, namespace)
    eager, rerun = copy.deepcopy(model), copy.deepcopy(model)
    jm.manual_seed(2)
    want = eager(x)
    want_key = np.asarray(jm.random.default_generator.get_state())
    jm.manual_seed(2)
    got = namespace["forward"](rerun, x)
    _assert_same(got, want, "output")
    _assert_same(rerun.state_dict(), eager.state_dict(), "state")
    np.testing.assert_array_equal(jm.random.default_generator.get_state(), want_key)


@pytest.mark.torch
def test_the_layer_list_covers_the_required_layers_and_the_table():
    covered = {c.name for c in CASES}
    assert covered >= REQUIRED
    exported = set(_exported_layers())
    assert {c.name for c in TABLE if c.name in exported} <= covered
    assert all(c.name in exported or c.name == "Sequential" for c in CASES)


@pytest.mark.torch  # the registries compare with PyTorch, and import it
def test_the_parity_registries_are_found_wherever_this_module_runs():
    # The registries live in tests/nn/layers/; a layer missing from TABLE takes its case
    # from there, and only falls back to a generic guess for a layer no registry has.
    registry = _registry_cases()
    assert {"Conv2d", "LSTM", "BatchNorm1d", "MultiheadAttention"} <= set(registry)
    assert any(c.source == "registry" for c in CASES)
