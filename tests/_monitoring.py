"""Counting what JAX compiles inside a block, from its monitoring events (a test helper)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from jax import monitoring

#: XLA compiled a program (a program the persistent compilation cache loads is not counted).
COMPILE = "/jax/core/compile/backend_compile_duration"
#: JAX traced a function to a jaxpr (a persistent compilation cache spares a compile,
#: never a trace).
TRACE = "/jax/core/compile/jaxpr_trace_duration"
#: JAX lowered a program (counted whether XLA then compiles it or a cache loads it).
LOWER = "/jax/core/compile/jaxpr_to_mlir_module_duration"


@contextlib.contextmanager
def counting(event: str = COMPILE) -> Iterator[list[str]]:
    """A list of the names of the programs ``event`` reports inside the block."""
    seen: list[str] = []

    def listener(name, duration, **kw):
        if name == event:
            seen.append(str(kw.get("fun_name", "")))

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        monitoring.unregister_event_duration_listener(listener)
