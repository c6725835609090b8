"""CRC-32 of array bytes, computed on a few threads.

CRC-32 catches every single-bit flip and every burst of up to 32 bits, and
``zlib.crc32`` runs at several GB/s and releases the GIL, so checksumming
overlaps with Orbax's writing and costs little on load.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _executor() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            workers = max(1, min(8, os.cpu_count() or 1))
            _pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="jm-crc")
        return _pool


def host_bytes(x: Any) -> np.ndarray:
    """The bytes of ``x`` (a jax or numpy array) as a flat uint8 numpy array.

    Free for arrays on the CPU; copies arrays on an accelerator to the host.
    """
    a = np.asarray(x, order="C")
    return a.reshape(-1).view(np.uint8)


def crc32(x: Any) -> str:
    """``"crc32:xxxxxxxx"`` of the bytes of ``x``."""
    return f"crc32:{zlib.crc32(host_bytes(x)):08x}"


def crc32_many(arrays: Sequence[Any]) -> Callable[[], list[str]]:
    """Start :func:`crc32` of every array on the pool; call the result to collect them."""
    futures = [_executor().submit(crc32, a) for a in arrays]
    return lambda: [f.result() for f in futures]
