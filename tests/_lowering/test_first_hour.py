"""What a new user meets in the first hour: held arrays and donation, tracebacks, summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jmodule as jm
import jmodule.nn.functional as F
from jmodule import _compilation_cache, nn

JMODULE_DIR = os.path.dirname(jm.__file__)


def _model_and_step():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = jm.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    @jm.compile
    def step(model, opt, x, y):
        opt.zero_grad()
        loss = jm.backward(lambda: F.cross_entropy(model(x), y))
        opt.step()
        return loss

    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 8)), jnp.float32)
    y = jnp.asarray([0, 1, 2, 3])
    return model, opt, step, x, y


@pytest.mark.slow
@pytest.mark.parametrize("steps_before", [0, 3])
def test_an_array_held_across_a_donated_step_is_named_once_before_it_is_deleted(steps_before):
    model, opt, step, x, y = _model_and_step()
    for _ in range(steps_before):
        step(model, opt, x, y)
    w = model[0].weight.data
    with pytest.warns(jm.DonatedHeldWarning) as record:
        step(model, opt, x, y)
        step(model, opt, x, y)
    assert len(record) == 1  # said once
    text = str(record[0].message)
    assert "'0.weight' of argument 0" in text and "deletes" in text
    assert ".copy()" in text and "donate=False" in text
    assert record[0].filename == __file__  # the user's line, not jmodule's
    assert w.is_deleted()  # donation as documented; the warning came first


@pytest.mark.slow
def test_a_state_dict_snapshot_held_across_a_donated_step_is_named_then_load_says_it_once():
    model, opt, step, x, y = _model_and_step()
    snapshot = model.state_dict()
    with pytest.warns(jm.DonatedHeldWarning, match=r"'0.weight' of argument 0 \(and 3 more\)"):
        step(model, opt, x, y)
    with pytest.raises(jm.DeletedArrayError) as info:
        model.load_state_dict(snapshot)
    assert str(info.value).count("were deleted") == 1
    del info  # its traceback holds load_state_dict's frame, and that the current arrays
    copied = {k: v.copy() for k, v in model.state_dict().items()}  # the fix it names
    step(model, opt, x, y)
    model.load_state_dict(copied)


def test_a_training_loop_that_holds_nothing_does_not_warn():
    model, opt, step, x, y = _model_and_step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            step(model, opt, x, y)
        copied = model[0].weight.data.copy()  # a copy is not the donated array
        step(model, opt, x, y)
    assert copied.shape == (16, 8)


def test_load_state_dict_of_deleted_arrays_says_it_once_with_the_fix():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    snapshot = model.state_dict()
    for v in snapshot.values():
        v.delete()
    other = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    with pytest.raises(jm.DeletedArrayError) as info:
        other.load_state_dict(snapshot)
    text = str(info.value)
    assert isinstance(info.value, RuntimeError)  # PyTorch's except RuntimeError still works
    assert text.count("were deleted") == 1 and text.count("\n") == 1  # one line, not one per key
    for key in snapshot:
        assert f'"{key}"' in text
    assert ".copy()" in text and "donate=False" in text


def _frames(exc: BaseException) -> list[str]:
    return [f.filename for f in traceback.extract_tb(exc.__traceback__)]


def test_eager_error_traceback_opens_with_the_users_line():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(15, 4))
    with pytest.raises(RuntimeError, match=r"in_features=15") as info:
        model(jnp.ones((2, 8)))
    frames = _frames(info.value)
    assert frames and not any(f.startswith(JMODULE_DIR) for f in frames), frames
    assert frames[-1] == __file__


def test_error_inside_jm_backward_shows_the_closures_line_not_jmodules():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(15, 4))
    with pytest.raises(RuntimeError, match=r"in_features=15") as info:
        jm.backward(lambda: model(jnp.ones((2, 8))).sum())
    frames = _frames(info.value)
    assert frames and not any(f.startswith(JMODULE_DIR) for f in frames), frames
    assert frames[-1] == __file__  # the closure's line


def _fails_step():
    model = nn.Linear(2, 2)
    opt = jm.optim.SGD(model.parameters(), lr=0.1)
    model.weight.grad = jnp.ones((3,))  # not the weight's shape
    opt.step()


def _fails_load_state_dict():
    nn.Linear(2, 2).load_state_dict({"weight": jnp.ones((3, 3)), "bias": jnp.ones(2)})


def _fails_save(tmp_path):
    jm.save({"f": lambda: 0}, tmp_path / "c")


def _fails_load(tmp_path):
    jm.load(tmp_path / "nothing-here")


_ENTRY_FAILURES = [_fails_step, _fails_load_state_dict, _fails_save, _fails_load]


@pytest.mark.parametrize("fails", _ENTRY_FAILURES, ids=lambda f: f.__name__)
def test_errors_of_the_other_entry_points_show_the_users_frames_only(fails, tmp_path):
    args = (tmp_path,) if "tmp_path" in fails.__code__.co_varnames else ()
    with pytest.raises(Exception) as info:
        fails(*args)
    frames = _frames(info.value)
    assert frames and not any(f.startswith(JMODULE_DIR) for f in frames), frames
    assert frames[-1] == __file__ or not frames[-1].startswith(JMODULE_DIR)


class _Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x)
        return x


def test_tracing_error_comes_first_not_after_jaxs():
    f = jm.compile(lambda m, x: m(x))
    with pytest.raises(jm.jit.TracingError) as info:
        f(_Branchy(), jnp.ones((2, 4)))
    err = info.value
    assert err.__cause__ is None  # no JAX error printed before ours
    assert isinstance(err.jax_error, jax.errors.TracerBoolConversionError)
    text = "".join(traceback.format_exception(err))
    assert text.index("Traceback") == 0 and "TracerBoolConversionError" in text
    assert text.count("Traceback (most recent call last)") == 1
    frames = _frames(err)
    assert frames[0] == __file__
    assert sum(f.startswith(JMODULE_DIR) for f in frames) <= 1  # at most the raise itself
    assert type(err).__module__ == "jmodule.jit"


def _run(code: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


@pytest.mark.slow
def test_traceback_of_a_script_and_unfiltered_mode():
    code = """
        import jax.numpy as jnp
        from jmodule import nn
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(15, 4))
        model(jnp.ones((2, 8)))
    """
    filtered = _run(code)
    assert filtered.returncode == 1
    assert "jmodule" + os.sep not in filtered.stderr.split("RuntimeError")[0]
    assert "removed their internal frames" in filtered.stderr
    unfiltered = _run(code, {"JAX_TRACEBACK_FILTERING": "off"})
    assert os.path.join("jmodule", "nn", "modules") in unfiltered.stderr
    assert "in_features=15" in unfiltered.stderr


@pytest.mark.slow
def test_print_of_summary_shows_one_table():
    code = """
        import jax.numpy as jnp
        import jmodule as jm
        model = jm.nn.Sequential(jm.nn.Linear(4, 8), jm.nn.ReLU(), jm.nn.Linear(8, 2))
        x = jnp.ones((3, 4))
        print(jm.summary(model, x, compiled=False))
        print("--")
        jm.summary(model, x, compiled=False)
        print("--")
        s = jm.summary(model, x, compiled=False)
    """
    out = _run(code)
    assert out.returncode == 0, out.stderr
    parts = out.stdout.split("--\n")
    assert [p.count("Total params: 58") for p in parts] == [1, 1, 1]


_CACHE_PROBE = """
import json, os, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import jax.numpy as jnp
    import jmodule as jm
    jm.nn.Linear(3, 2)(jnp.ones((1, 3))).block_until_ready()
d = jm.compilation_cache_dir()
print(json.dumps({
    "dir": d,
    "entries": len(os.listdir(d)) if d else 0,
    "warnings": [str(w.message) for w in caught if "compilation cache" in str(w.message)],
}))
"""


def _probe(env: dict) -> dict:
    import json

    base = {k: v for k, v in os.environ.items() if not k.startswith(("JMODULE_", "JAX_COMP"))}
    out = subprocess.run(
        [sys.executable, "-c", _CACHE_PROBE],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_compilation_cache_is_on_by_default_in_the_user_cache_dir_and_can_be_turned_off(tmp_path):
    got = _probe({"XDG_CACHE_HOME": str(tmp_path)})
    assert got["dir"] == str(tmp_path / "jmodule" / "xla")
    assert got["entries"] > 0 and not got["warnings"]  # the program was stored there
    moved = tmp_path / "elsewhere"
    assert _probe({"JMODULE_COMPILATION_CACHE": str(moved)})["dir"] == str(moved)
    assert (
        _probe({"JMODULE_COMPILATION_CACHE": "0", "XDG_CACHE_HOME": str(tmp_path)})["dir"] is None
    )


@pytest.mark.slow
def test_an_unwritable_compilation_cache_is_said_once_and_left_off(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    got = _probe({"JMODULE_COMPILATION_CACHE": str(blocker / "xla")})
    assert got["dir"] is None
    assert len(got["warnings"]) == 1 and "JMODULE_COMPILATION_CACHE" in got["warnings"][0]
    before = jm.compilation_cache_dir()
    with pytest.raises(OSError, match=r"cannot be written.*Nothing changed"):
        jm.set_compilation_cache(blocker / "xla")
    assert jm.compilation_cache_dir() == before


_MULTIPROCESS_PROBE = """
import json, os
import jax
import jmodule as jm
from jmodule import _compilation_cache as cache

default = jm.compilation_cache_dir()
left = cache.leave_default_for_multiprocess()  # what jm.distributed.init() does after joining
after = jm.compilation_cache_dir()
again = cache.leave_default_for_multiprocess()
jm.set_compilation_cache(default)  # the user's own choice, after init: kept
kept = cache.leave_default_for_multiprocess(), jm.compilation_cache_dir()
print(json.dumps({"default": default, "left": left, "after": after, "again": again,
                  "kept": list(kept)}))
"""


@pytest.mark.slow
def test_a_multiprocess_job_turns_off_the_default_cache_and_keeps_the_users(tmp_path):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JMODULE_", "JAX_COMP"))}
    out = subprocess.run(
        [sys.executable, "-c", _MULTIPROCESS_PROBE],
        capture_output=True,
        text=True,
        env={**base, "XDG_CACHE_HOME": str(tmp_path)},
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["default"] == str(tmp_path / "jmodule" / "xla")
    assert got["left"] is True and got["after"] is None and got["again"] is False
    assert got["kept"] == [False, got["default"]]
    # a cache configured before the import (here, by conftest) is the user's: left alone
    before = jm.compilation_cache_dir()
    assert before is not None
    assert _compilation_cache.leave_default_for_multiprocess() is False
    assert jm.compilation_cache_dir() == before
