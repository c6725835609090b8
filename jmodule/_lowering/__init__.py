"""Lowering: module state bound into pure functions, compiled with ``jax.jit``."""
