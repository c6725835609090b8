"""The optimizers are composed of shared pieces, each written once (``optim/_transforms.py``).

PyTorch's frame around every optimizer's own arithmetic (negate the gradient
for ``maximize``, L2 or decoupled weight decay, the learning rate) is built by
``_transforms.torch_chain`` from the structure ``_transforms.frame`` gives. Two
kinds of check:

* The source: no other file of ``jmodule/optim`` writes a frame piece again
  (``optax.scale(-1)``, ``add_decayed_weights``, ``scale_by_learning_rate``,
  ``trace``, ``named_chain``, Adam's ``update_moment``) or reads the frame's
  options or structure entries (``["maximize"]``, ``("decay", ...)``) itself.
* The arithmetic: every optimizer with ``maximize`` or ``weight_decay`` follows
  torch, live, in float64, eagerly and compiled, over three param groups with
  different options (one plain, one maximising, one decaying, decoupled where
  the optimizer can), and after the options change half way (which changes
  the chain's structure).
"""

from __future__ import annotations

import ast
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import side_by_side
from _paths import PACKAGE
from _torch import torch

import jmodule as jm
from jmodule import optim
from jmodule.optim import _transforms

OPTIM = PACKAGE / "optim"
TOL = side_by_side.TOL
STEPS = 6

# ---------------------------------------------------------------------------- the source

#: Calls that build a frame piece: only ``_transforms.py`` makes them.
FRAME_CALLS = frozenset(
    {
        "optax.add_decayed_weights",
        "optax.scale_by_learning_rate",
        "optax.trace",
        "optax.named_chain",
        "optax.tree.update_moment",
    }
)
#: Option names and structure keys of the frame: only ``_transforms.py`` reads them.
FRAME_KEYS = frozenset({"maximize", "decay", "decoupled", "weight_decay", "decoupled_weight_decay"})


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _is_minus_one(node: ast.AST) -> bool:
    try:
        return ast.literal_eval(node) == -1
    except ValueError:
        return False


def _frame_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of each place that writes a frame piece or reads a frame key."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name in FRAME_CALLS:
                found.append((node.lineno, f"{name}(...)"))
            elif name == "optax.scale" and node.args and _is_minus_one(node.args[0]):
                found.append((node.lineno, "optax.scale(-1)"))
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if isinstance(key, ast.Constant) and key.value in FRAME_KEYS:
                # hp["weight_decay"] handed to an optimizer's own scaling is its business
                if not (key.value == "weight_decay" and _dotted(node.value) == "hp"):
                    found.append((node.lineno, f"[{key.value!r}]"))
        elif isinstance(node, ast.Tuple) and node.elts:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and first.value in FRAME_KEYS:
                found.append((node.lineno, f"({first.value!r}, ...)"))
    return found


def test_the_frame_pieces_are_written_once_in_transforms():
    here = _frame_uses(ast.parse((OPTIM / "_transforms.py").read_text()))
    assert {what for _, what in here} >= {
        "optax.scale(-1)",
        "optax.add_decayed_weights(...)",
        "optax.scale_by_learning_rate(...)",
        "optax.trace(...)",
        "optax.named_chain(...)",
        "optax.tree.update_moment(...)",
        "['maximize']",
        "['weight_decay']",
        "['decoupled_weight_decay']",
        "('decay', ...)",
    }
    elsewhere = [
        f"{path.name}:{line}: {what}"
        for path in sorted(OPTIM.glob("*.py"))
        if path.name != "_transforms.py"
        for line, what in _frame_uses(ast.parse(path.read_text()))
    ]
    assert elsewhere == [], "frame pieces written again outside _transforms.py:\n" + "\n".join(
        elsewhere
    )


def test_the_source_check_sees_a_piece_written_again():
    source = (
        "def _transformation(self, cfg, hp, state):\n"
        "    chain = [('maximize', optax.scale(-1.0))] if cfg['maximize'] else []\n"
        "    chain.append(('lr', optax.scale_by_learning_rate(hp['lr'])))\n"
        "    return optax.named_chain(*chain)\n"
    )
    assert sorted(what for _, what in _frame_uses(ast.parse(source))) == [
        "('maximize', ...)",
        "['maximize']",
        "optax.named_chain(...)",
        "optax.scale(-1)",
        "optax.scale_by_learning_rate(...)",
    ]


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out += [sub, *_subclasses(sub)]
    return out


#: The public optimizers built as an optax chain (LBFGS runs its own loop, no chain).
TORCH_OPTIMIZERS = sorted(
    {
        c
        for c in _subclasses(optim.TorchOptimizer)
        if getattr(optim, c.__name__, None) is c
        and c._transformation.__func__ is not optim.TorchOptimizer._transformation.__func__
    },
    key=lambda c: c.__name__,
)


@pytest.mark.parametrize("cls", TORCH_OPTIMIZERS, ids=lambda c: c.__name__)
def test_every_optimizer_is_composed_in_the_frame_in_torchs_order(cls):
    """Negation first (after pass-through counts), then L2 decay; decoupled decay, then lr."""
    takes = inspect.signature(cls).parameters
    given = (("maximize", True), ("weight_decay", 0.25), ("momentum", 0.5))
    options = {k: v for k, v in given if k in takes}
    p = jm.nn.Parameter(jnp.ones((2, 2)))
    for decoupled in (False, True) if "decoupled_weight_decay" in takes else (None,):
        extra = {} if decoupled is None else {"decoupled_weight_decay": decoupled}
        opt = cls([p], **options, **extra)
        cfg = opt._structure(opt.param_groups[0])
        hp = {n: 0.5 for n, _, _ in opt._hyper}
        names = list(opt._transformation(dict(cfg), hp, None).init(p.data))
        frame = [n for n in names if n not in ("maximize", "weight_decay", "lr", "step")]
        assert frame, names  # the optimizer's own scaling
        first, last = names.index(frame[0]), names.index(frame[-1])
        assert ("maximize" in names) == ("maximize" in options), names
        if "maximize" in names:
            assert names.index("maximize") == first - 1 - ("weight_decay" in names[:first])
        if "weight_decay" in names:
            after = names.index("weight_decay") > last
            assert after == bool(decoupled or cls is optim.Muon or cls is optim.AdamW), names
        assert ("lr" in names) == (names[-1] == "lr")


def test_torch_chain_composes_the_pieces_in_order():
    hp = {"lr": 0.5, "weight_decay": 0.25}
    double = ("double", optax.scale(2.0))
    p, g = jnp.array([4.0]), jnp.array([1.0])
    for cfg, want in (
        ({}, -0.5 * 2 * 1.0),
        ({"maximize": True}, -0.5 * 2 * -1.0),
        ({"decay": True}, -0.5 * 2 * (1.0 + 0.25 * 4.0)),
        ({"decay": True, "decoupled": True}, -0.5 * (2 * 1.0 + 0.25 * 4.0)),
        ({"maximize": True, "decay": True, "decoupled": True}, -0.5 * (2 * -1.0 + 0.25 * 4.0)),
    ):
        tx = _transforms.torch_chain(cfg, hp, double)
        assert float(tx.update(g, tx.init(p), p)[0][0]) == want, cfg
    tx = _transforms.torch_chain({"maximize": True}, hp, double, lr=False)
    assert list(tx.init(p)) == ["maximize", "double"]
    assert float(tx.update(g, tx.init(p), p)[0][0]) == -2.0


# ---------------------------------------------------------------------------- against torch

#: ``(optimizer, options of all groups, [options of groups 1 and 2], [after the change])``.
#: Group 0 keeps the optimizer's defaults until the change.
CASES = [
    ("SGD", {"lr": 0.05}, [{"maximize": True}, {"weight_decay": 0.1}], {"maximize": True}),
    (
        "SGD",
        {"lr": 0.05, "momentum": 0.9, "nesterov": True},
        [{"maximize": True, "weight_decay": 0.1}, {"weight_decay": 0.2}],
        {"weight_decay": 0.3},
    ),
    (
        "Adam",
        {"lr": 0.01},
        [
            {"maximize": True, "weight_decay": 0.1},
            {"weight_decay": 0.2, "decoupled_weight_decay": True},
        ],
        {"weight_decay": 0.1, "maximize": True},
    ),
    (
        "Adam",
        {"lr": 0.01, "amsgrad": True},
        [
            {"maximize": True, "weight_decay": 0.1, "decoupled_weight_decay": True},
            {"weight_decay": 0.2},
        ],
        {"weight_decay": 0.1, "decoupled_weight_decay": True},
    ),
    (
        "AdamW",
        {"lr": 0.01},
        [{"maximize": True, "weight_decay": 0.0}, {"weight_decay": 0.2}],
        {"maximize": True},
    ),
    (
        "Adamax",
        {"lr": 0.01},
        [{"maximize": True}, {"weight_decay": 0.2}],
        {"weight_decay": 0.1, "maximize": True},
    ),
    (
        "Adadelta",
        {"lr": 0.5},
        [{"maximize": True}, {"weight_decay": 0.2}],
        {"weight_decay": 0.1},
    ),
    (
        "Adagrad",
        {"lr": 0.1, "lr_decay": 0.05},
        [{"maximize": True, "weight_decay": 0.1}, {"weight_decay": 0.2}],
        {"maximize": True},
    ),
    (
        "ASGD",
        {"lr": 0.05, "t0": 2},
        [{"maximize": True}, {"weight_decay": 0.2}],
        {"weight_decay": 0.1, "maximize": True},
    ),
    (
        "RMSprop",
        {"lr": 0.01, "momentum": 0.5, "centered": True},
        [{"maximize": True}, {"weight_decay": 0.2}],
        {"weight_decay": 0.1},
    ),
    (
        "NAdam",
        {"lr": 0.01},
        [
            {"maximize": True, "weight_decay": 0.1},
            {"weight_decay": 0.2, "decoupled_weight_decay": True},
        ],
        {"weight_decay": 0.1, "decoupled_weight_decay": True, "maximize": True},
    ),
    (
        "RAdam",
        {"lr": 0.01, "betas": (0.8, 0.9)},  # rectified from step 3 (rho_inf = 19)
        [
            {"maximize": True, "weight_decay": 0.1, "decoupled_weight_decay": True},
            {"weight_decay": 0.2},
        ],
        {"weight_decay": 0.1, "maximize": True},
    ),
    ("Rprop", {"lr": 0.01}, [{"maximize": True}, {"lr": 0.02}], {"maximize": True}),
    (
        "Adafactor",
        {"lr": 0.05},
        [{"maximize": True}, {"weight_decay": 0.2}],
        {"weight_decay": 0.1, "maximize": True},
    ),
]
IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(CASES)]


@pytest.fixture(autouse=True)
def _x64():
    with jax.enable_x64(True):
        yield


def _net(nn, bias: bool = True):
    return nn.Sequential(
        nn.Linear(4, 6, bias=bias),
        nn.Tanh(),
        nn.Linear(6, 5, bias=bias),
        nn.Tanh(),
        nn.Linear(5, 3, bias=bias),
    )


def _groups(params: list, options: list[dict]) -> list[dict]:
    """Three groups (two parameters each with biases, so packed), the last two with options."""
    per = len(params) // 3
    chunks = [params[i * per : (i + 1) * per] for i in range(3)]
    return [{"params": chunks[0]}] + [
        {"params": c, **o} for c, o in zip(chunks[1:], options, strict=True)
    ]


def _train(name, options, groups, change, *, bias=True):
    tm, eager, compiled = side_by_side.models(lambda nn: _net(nn, bias), seed=5)
    topt = getattr(torch.optim, name)(_groups(list(tm.parameters()), groups), **options)
    jopts = [
        getattr(optim, name)(_groups(list(m.parameters()), groups), **options)
        for m in (eager, compiled)
    ]
    rng = np.random.default_rng(7)
    for k in range(STEPS):
        if k == STEPS // 2:  # the frame's options change: a new chain structure
            for opt in (topt, *jopts):
                opt.param_groups[0].update(change)
        x, y = rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
        side_by_side.step_all(tm, topt, eager, compiled, jopts, x, y)
        side_by_side.assert_params_match(tm, [eager, compiled])
        side_by_side.assert_state_matches(topt, jopts, layout=True)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize("name, options, groups, change", CASES, ids=IDS)
def test_maximize_and_weight_decay_per_group_match_torch_float64(name, options, groups, change):
    _train(name, options, groups, change)


@pytest.mark.slow
@pytest.mark.torch
def test_muon_decoupled_weight_decay_per_group_matches_torch_float64():
    _train(
        "Muon",
        {"lr": 0.02},
        [{"weight_decay": 0.0}, {"weight_decay": 0.3, "nesterov": False}],
        {"weight_decay": 0.5},
        bias=False,
    )


def _embedding_loss(a, b, idx, w):
    return (a(idx) * w).sum() + (b(idx) ** 2).mean()


@pytest.mark.slow
@pytest.mark.torch
def test_sparse_adam_maximize_per_group_matches_torch_float64():
    torch.manual_seed(1)
    ta, tb = (torch.nn.Embedding(8, 3, sparse=True).double() for _ in range(2))
    ja, jb = (jm.nn.Embedding(8, 3, sparse=True).to(jm.float64) for _ in range(2))
    for t, j in ((ta, ja), (tb, jb)):
        j.load_state_dict({k: v.numpy() for k, v in t.state_dict().items()})
    groups = lambda a, b: [{"params": a.parameters()}, {"params": b.parameters(), "maximize": True}]
    topt = torch.optim.SparseAdam(groups(ta, tb), lr=0.05)
    jopt = optim.SparseAdam(groups(ja, jb), lr=0.05)
    rng = np.random.default_rng(2)
    for k in range(STEPS):
        if k == STEPS // 2:
            for opt in (topt, jopt):
                opt.param_groups[0]["maximize"] = True
                opt.param_groups[1]["maximize"] = False
        idx, w = rng.integers(0, 8, size=(2, 3)), rng.standard_normal((2, 3, 3))
        topt.zero_grad()
        _embedding_loss(ta, tb, torch.tensor(idx), torch.tensor(w)).backward()
        topt.step()
        jopt.zero_grad()
        jm.backward(lambda: _embedding_loss(ja, jb, jnp.asarray(idx), jnp.asarray(w)))
        jopt.step()
        for t, j in ((ta, ja), (tb, jb)):
            np.testing.assert_allclose(
                np.asarray(j.weight.data), t.weight.detach().numpy(), rtol=TOL, atol=TOL
            )
    tsd, jsd = topt.state_dict(), jopt.state_dict()
    assert jsd["param_groups"] == tsd["param_groups"]
    for i, tstate in tsd["state"].items():
        assert jsd["state"][i]["step"] == tstate["step"]
        for k in ("exp_avg", "exp_avg_sq"):
            np.testing.assert_allclose(
                np.asarray(jsd["state"][i][k]), tstate[k].numpy(), rtol=TOL, atol=TOL
            )
