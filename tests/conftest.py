"""Test configuration: a persistent compilation cache and strict JAX settings."""

import gc
import os
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Tests check what programs compute, not how fast XLA's code runs: LLVM's optimization level 0
# halves XLA:CPU's compile time (most of the suite's time) and leaves the HLO, its fusions and
# memory figures as they are. JMODULE_TEST_FAST_COMPILE=0 runs with XLA's defaults (the
# Python 3.12 environment of `make test` does, so CI tests both); subprocesses inherit it.
if os.environ.get("JMODULE_TEST_FAST_COMPILE", "1") != "0":
    _flags = os.environ.get("XLA_FLAGS", "")
    if "xla_backend_optimization_level" not in _flags:
        os.environ["XLA_FLAGS"] = f"{_flags} --xla_backend_optimization_level=0".strip()

import _torch
import jax
import pytest

_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "jmodule-tests-jax")
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After each test module, JAX's in-memory compiled programs are dropped.

    A worker runs hundreds of modules; keeping every executable they compiled
    grew each to 5-6 GB, so two workers and PyTorch swapped on a 2-core CI
    machine. A program a later module needs again comes back from the
    persistent compilation cache.
    """
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same default-generator seed."""
    import jmodule as jm

    jm.manual_seed(0)
    yield


def pytest_report_header(config):
    """Say which PyTorch the run compares with, or that tests needing it do not run."""
    if _torch.INSTALLED:
        return f"PyTorch {_torch.torch.__version__}: tests marked torch run"
    here = Path(__file__).parent
    modules = sum(_torch.module_marked_file(p) for p in here.rglob("test_*.py"))
    return (
        f"PyTorch is not installed: tests marked torch do not run ({modules} test modules "
        "are not collected, and marked tests elsewhere are deselected)"
    )


def pytest_ignore_collect(collection_path, config):
    """Without PyTorch, a module marked torch as a whole is not imported."""
    if _torch.INSTALLED or collection_path.suffix != ".py":
        return None
    if collection_path.name.startswith("test_") and _torch.module_marked_file(collection_path):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    """Without PyTorch, tests marked torch are deselected (counted as such in the summary)."""
    if _torch.INSTALLED:
        return
    drop = [item for item in items if item.get_closest_marker("torch")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if not item.get_closest_marker("torch")]
