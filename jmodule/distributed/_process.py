"""Several processes (hosts): ``init`` wraps ``jax.distributed.initialize``.

Arguments not given are read from the environment: JAX's own variables
(``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``) or
the ones ``torchrun`` sets (``MASTER_ADDR`` + ``MASTER_PORT``, ``WORLD_SIZE``,
``RANK``). Whatever is still missing is left to JAX's cluster detection
(Slurm, Open MPI, Cloud TPU, Kubernetes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import jax

from jmodule import _compilation_cache
from jmodule import _jax_internals as _jx

_log = logging.getLogger("jmodule.distributed")

__all__ = ["get_rank", "get_world_size", "init", "is_initialized"]

_ADDRESS_VARS = ("JAX_COORDINATOR_ADDRESS", "MASTER_ADDR + MASTER_PORT")
_COUNT_VARS = ("JAX_NUM_PROCESSES", "WORLD_SIZE")
_ID_VARS = ("JAX_PROCESS_ID", "RANK")


def _env_int(names: Sequence[str]) -> int | None:
    for name in names:
        raw = os.environ.get(name)
        if raw is not None and raw.strip():
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def _env_address() -> str | None:
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address:
        return address
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if host and port:
        return f"{host}:{port}"
    return None


def init(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_ids: int | Sequence[int] | None = None,
    cpu_collectives: str | None = None,
    **kwargs: Any,
) -> None:
    """Join this process to a multi-process JAX job (``jax.distributed.initialize``).

    Call it first, before anything touches JAX devices, in every process.
    Afterwards ``jax.devices()`` lists every process's devices, a mesh over
    them spans hosts, and compiled steps run as one SPMD program across them.

    Args:
        coordinator_address: ``host:port`` of process 0's coordinator; default
            ``JAX_COORDINATOR_ADDRESS`` or ``MASTER_ADDR:MASTER_PORT``.
        num_processes: process count; default ``JAX_NUM_PROCESSES`` or
            ``WORLD_SIZE``.
        process_id: this process's index; default ``JAX_PROCESS_ID`` or ``RANK``.
        local_device_ids: restrict this process to these local devices.
        cpu_collectives: CPU collectives implementation (``"gloo"``, JAX's
            default, or ``"mpi"``), for jobs whose devices are CPUs.
        **kwargs: passed to ``jax.distributed.initialize`` (timeouts, ...).

    Raises:
        RuntimeError: already initialised, or JAX already started its backends
            in this process.
        ValueError: settings missing and not detectable, or malformed.

    In each process of a two-process job, first thing (here process 0)::

        import jmodule as jm
        jm.distributed.init("10.0.0.1:1234", num_processes=2, process_id=0)

    Once JAX has started in a process, it is too late:

    >>> import jax, jmodule as jm
    >>> _ = jax.devices()
    >>> jm.distributed.init("10.0.0.1:1234", num_processes=2, process_id=0)
    Traceback (most recent call last):
    ...
    RuntimeError: jm.distributed.init() must run before anything uses JAX devices (creating
    a model, an array, or calling jax.devices()): call it first in the program.
    """
    if jax.distributed.is_initialized():
        raise RuntimeError(
            "jm.distributed.init() was already called in this process (it can run once)."
        )
    coordinator_address = coordinator_address or _env_address()
    if num_processes is None:
        num_processes = _env_int(_COUNT_VARS)
    if process_id is None:
        process_id = _env_int(_ID_VARS)
    if cpu_collectives is not None:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    try:
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            local_device_ids=local_device_ids,
            **kwargs,
        )
    except RuntimeError as e:
        if _jx.is_backend_started_error(e):
            raise RuntimeError(
                "jm.distributed.init() must run before anything uses JAX devices (creating a "
                "model, an array, or calling jax.devices()): call it first in the program."
            ) from e
        raise
    except ValueError as e:
        raise ValueError(
            f"jm.distributed.init(): {e} Give coordinator_address, num_processes and "
            f"process_id, or set {' / '.join(_ADDRESS_VARS)}, {' / '.join(_COUNT_VARS)} and "
            f"{' / '.join(_ID_VARS)} (or run under Slurm, Open MPI or on Cloud TPU, which "
            "JAX detects)."
        ) from e
    if _compilation_cache.leave_default_for_multiprocess():
        _log.info(
            "jm.distributed.init(): the default compilation cache is off in a multi-process job "
            "(JAX 0.12.1 hangs running a cached program with cross-process collectives); "
            "jm.set_compilation_cache(path) turns it on again"
        )


def is_initialized() -> bool:
    """Whether :func:`init` (``jax.distributed.initialize``) has run in this process."""
    return jax.distributed.is_initialized()


def get_rank() -> int:
    """This process's index (``jax.process_index()``); 0 in a single-process program.

    >>> import jmodule as jm
    >>> jm.distributed.get_rank()
    0
    """
    return jax.process_index()


def get_world_size() -> int:
    """The number of processes (``jax.process_count()``); 1 in a single-process program.

    >>> import jmodule as jm
    >>> jm.distributed.get_world_size()
    1
    """
    return jax.process_count()
