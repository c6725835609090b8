"""Test configuration: a persistent compilation cache and strict JAX settings."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest

_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "jmodule-tests-jax")
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.2)


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same default-generator seed."""
    import jmodule as jm

    jm.manual_seed(0)
    yield
