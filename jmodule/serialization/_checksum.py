"""Checksums of array bytes: CRC-32C (hardware) for new checkpoints, CRC-32 still read.

A checksum is written as ``"<algorithm>:<8 hex digits>"``. New checkpoint
directories use ``crc32c`` (Castagnoli), computed by ``google-crc32c`` with
the CPU's CRC instructions (SSE4.2 on x86, the CRC extension on ARM) at
several GB/s per core, without holding the GIL. Directories written before
carry ``crc32`` (``zlib.crc32``, about 1 GB/s), which is still verified.
Both detect every single-bit flip and every burst of up to 32 bits.

Nothing here is shared between calls: each batch runs on threads it starts
and stops itself (through ``_threads``, so that it works while Python exits).
"""

from __future__ import annotations

import os
import queue
import threading
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import google_crc32c
import numpy as np

from jmodule.serialization import _threads

#: The algorithm new checkpoint directories are written with.
ALGORITHM = "crc32c"
_ALGORITHMS: dict[str, Callable[[Any], int]] = {
    "crc32c": google_crc32c.value,
    "crc32": zlib.crc32,
}
#: Threads a batch of checksums with nothing else to do runs on (each is memory-bound).
_WORKERS = max(1, min(4, os.cpu_count() or 1))


def host_bytes(x: Any) -> np.ndarray:
    """The bytes of ``x`` (a jax or numpy array) as a flat uint8 numpy array.

    Free for arrays on the CPU; copies arrays on an accelerator to the host.
    """
    a = np.asarray(x, order="C")
    return a.reshape(-1).view(np.uint8)


def algorithm_of(checksum: str) -> str | None:
    """The algorithm a checksum string names, or ``None`` if it names none this reads."""
    name, sep, _ = checksum.partition(":")
    return name if sep and name in _ALGORITHMS else None


def digest(x: Any, algorithm: str = ALGORITHM) -> str:
    """``"<algorithm>:xxxxxxxx"`` of the bytes of ``x``."""
    return f"{algorithm}:{_ALGORITHMS[algorithm](host_bytes(x)) & 0xFFFFFFFF:08x}"


def crc32(x: Any) -> str:
    """``"crc32:xxxxxxxx"`` of the bytes of ``x`` (the format of jm's safetensors files)."""
    return digest(x, "crc32")


class Batch:
    """Checksums computed on threads of their own while the caller does other work.

    Use as a context manager: ``add`` starts one, ``results`` waits for all
    of them, leaving the block stops the threads. One thread (the default)
    checksums several GB/s while leaving the other cores to the work it
    overlaps (Orbax's writer, TensorStore's reads). Where no thread can start
    (Python exiting), ``add`` computes the checksum itself.
    """

    def __init__(self, workers: int = 1):
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._out: list[list] = []  # per checksum: [digest or None, error or None]
        self._refused = False

    def add(self, x: Any, algorithm: str = ALGORITHM) -> None:
        """Start the checksum of ``x`` with ``algorithm``."""
        slot: list = [None, None]
        self._out.append(slot)
        if len(self._threads) < self._workers and not self._refused:
            thread = threading.Thread(target=self._work, name="jm-crc")
            if _threads.start(thread):
                self._threads.append(thread)
            else:
                self._refused = True
        if self._threads:
            self._jobs.put((slot, x, algorithm))
        else:
            self._compute(slot, x, algorithm)

    @staticmethod
    def _compute(slot: list, x: Any, algorithm: str) -> None:
        try:
            slot[0] = digest(x, algorithm)
        except BaseException as error:
            slot[1] = error

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._compute(*job)

    def _stop(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []

    def results(self) -> list[str]:
        """Every checksum started, in the order started."""
        self._stop()
        for _, error in self._out:
            if error is not None:
                raise error
        return [d for d, _ in self._out]

    def __enter__(self) -> Batch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()


def many(arrays: Iterable[Any], algorithms: Iterable[str] | str = ALGORITHM) -> list[str]:
    """The checksums of ``arrays`` (each with its algorithm), computed on a few threads."""
    arrays = list(arrays)
    names = [algorithms] * len(arrays) if isinstance(algorithms, str) else list(algorithms)
    if not arrays:
        return []
    # One task per thread, each a share of the arrays balanced by bytes (one task
    # per array costs more than the checksum of a small one).
    shares: list[list[int]] = [[] for _ in range(min(_WORKERS, len(arrays)))]
    loads = [0] * len(shares)
    for i in sorted(range(len(arrays)), key=lambda i: -int(arrays[i].nbytes)):
        least = loads.index(min(loads))
        shares[least].append(i)
        loads[least] += int(arrays[i].nbytes)
    out: list[str] = [""] * len(arrays)

    def run(share: list[int]) -> None:
        for i in share:
            out[i] = digest(arrays[i], names[i])

    _threads.each(run, shares, "jm-crc")
    return out


def crc32_many(arrays: Sequence[Any]) -> Callable[[], list[str]]:
    """:func:`crc32` of every array (for safetensors files); call the result to collect them."""
    out = many(arrays, "crc32")
    return lambda: out
