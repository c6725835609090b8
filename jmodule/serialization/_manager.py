"""Numbered checkpoints of a training run, saved in the background.

:class:`CheckpointManager` keeps ``directory/<step>`` checkpoints written by
``jm.save``'s atomic path: a step directory exists only once it is complete,
so :meth:`~CheckpointManager.restore` always finds the latest complete step,
however the previous run ended.

>>> import tempfile, jax.numpy as jnp, jmodule as jm
>>> mngr = jm.checkpoint.CheckpointManager(tempfile.mkdtemp(), max_to_keep=2)
>>> for step in range(3):
...     _ = mngr.save(step, {"w": jnp.full(2, step)})
>>> mngr.wait_until_finished()
>>> mngr.all_steps(), int(mngr.restore()["w"][0])
([1, 2], 2)
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from pathlib import Path
from typing import Any

import jax

from jmodule.serialization import _atomic, _directory, _errors, _inflight, _metafile, _threads
from jmodule.serialization._errors import CheckpointExistsError, CheckpointNotFoundError

__all__ = ["CheckpointManager"]


def _leads() -> bool:
    """Whether this process tidies the directory: the only one, or process 0 of several."""
    return not _directory.multiprocess() or jax.process_index() == 0


def _barrier(name: str) -> None:
    """Wait for every process of a multi-process job (nothing in a single process)."""
    if _directory.multiprocess():
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class CheckpointManager:
    """Save numbered steps to ``directory``, keep the newest, restore the latest complete one.

    Args:
        directory: where step checkpoints live (created if missing).
        max_to_keep: how many steps to keep; older ones are deleted after
            each save. ``None`` keeps all.
        save_interval_steps: :meth:`save` writes only steps that are a
            multiple of this (unless ``force=True``).
        async_: write in a background thread. :meth:`save` returns once the
            arrays are snapshotted (an asynchronously dispatched copy on the
            CPU, a device-to-host copy on accelerators), so the training step
            may update or donate them at once. A save waits for the previous
            one; errors of a background save are raised by the next
            :meth:`save` (before it starts its own step), :meth:`restore`,
            :meth:`wait_until_finished` or :meth:`close`. A save still in
            flight when Python exits is finished first; if it fails, its
            error is printed on stderr and the process exits with status 1.

    On start, leftovers of saves killed mid-way (by a crash, a pre-emption)
    are finished or removed; the next save brings the number of kept steps
    back to ``max_to_keep``. Leftovers of a process still running are left
    alone, and so are those that cannot be removed: a manager opened on a
    read-only directory restores from it (saving there raises
    ``NotWritableError``).

    One manager (one process) should write to a directory at a time. If two
    do, they never both succeed with the same step: the one that commits it
    first wins, and the other gets ``CheckpointExistsError`` naming the step
    (from :meth:`save` itself, or for a background save from the next call
    that waits for it, as for any background error), its copy discarded.
    In a job of several ``jax.distributed`` processes, every process creates
    the manager and calls :meth:`save` with the same arguments (``async_=False``:
    a background save would run collectives beside the training step's);
    process 0 tidies the directory.

    >>> import tempfile, jax.numpy as jnp, jmodule as jm
    >>> with jm.checkpoint.CheckpointManager(tempfile.mkdtemp()) as mngr:
    ...     mngr.save(10, {"w": jnp.ones(3)})
    ...     mngr.wait_until_finished()
    ...     mngr.latest_step()
    True
    10
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_to_keep: int | None = None,
        save_interval_steps: int = 1,
        async_: bool = True,
    ):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be None or at least 1, got {max_to_keep}")
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps must be at least 1, got {save_interval_steps}")
        self.directory = Path(os.path.abspath(os.fspath(directory)))
        self.max_to_keep = max_to_keep
        self.save_interval_steps = save_interval_steps
        self.async_ = async_
        with _errors.saving(self.directory, lambda: None):
            self.directory.mkdir(parents=True, exist_ok=True)
        # The background saves whose outcome no call has taken yet, and the errors taken
        # but not yet raised (each is raised once, by the next call that waits). Calls
        # from several threads take them under the lock, so no save's outcome is lost.
        self._lock = threading.RLock()
        self._pending: list[concurrent.futures.Future] = []
        self._errors: list[BaseException] = []
        if _leads():
            for name in _atomic.leftover_names(self.directory):
                _atomic.repair(self.directory / name)
        _barrier("jm-checkpoint-manager-start")

    def _path(self, step: int) -> Path:
        return self.directory / str(step)

    def all_steps(self) -> list[int]:
        """Steps with a complete checkpoint, ascending."""
        steps = []
        for name in os.listdir(self.directory):
            if name.isdigit() and str(int(name)) == name:
                if _metafile.is_complete(self.directory / name):
                    steps.append(int(name))
        return sorted(steps)

    def latest_step(self) -> int | None:
        """The newest complete step, or ``None``."""
        steps = self.all_steps()
        return steps[-1] if steps else None

    def should_save(self, step: int) -> bool:
        """Whether :meth:`save` would write ``step``."""
        return step % self.save_interval_steps == 0

    def save(self, step: int, obj: Any, *, force: bool = False, overwrite: bool = False) -> bool:
        """Save ``obj`` (anything ``jm.save`` takes) as ``step``.

        Args:
            step: a non-negative int.
            obj: the state to save, e.g. ``{"model": model.state_dict(), "epoch": e}``.
            force: save even if ``step`` is not a multiple of ``save_interval_steps``.
            overwrite: replace an existing checkpoint of this step (atomically).

        Returns:
            Whether a save was started.

        Raises:
            CheckpointExistsError: ``step`` exists and ``overwrite`` is false,
                also when another writer saved it while this one was writing.
            DiskFullError: the disk filled up (nothing is left behind).
            NotWritableError: the directory cannot be written.
            TypeError: ``obj`` holds a value ``jm.save`` cannot store.
            NotImplementedError: ``async_`` is true in a job of several processes.

        With ``async_``, errors met while writing (a step lost to another
        writer, a full disk, an unwritable directory) are raised by the next
        call that waits for this save instead (or reported at exit). A
        ``save`` that raises an earlier save's error has started its own save
        first: one failed step does not lose the next.
        """
        if type(step) is not int or step < 0:
            raise ValueError(f"step must be a non-negative int, got {step!r}")
        if not (force or self.should_save(step)):
            return False
        if self.async_ and _directory.multiprocess():
            raise NotImplementedError(
                "CheckpointManager(async_=True) cannot save in a job of several processes "
                "(a background save would run collectives alongside the training step's and "
                "could deadlock); use CheckpointManager(directory, async_=False), or jm.save, "
                "which every process calls with the same path."
            )
        with self._lock:
            # An earlier background save's error is raised by this call, but only once
            # this step's save has started: one failed step does not lose the next.
            earlier = self._take_error()
            if earlier is not None and not isinstance(earlier, Exception):
                raise earlier  # KeyboardInterrupt (in a writer, or while waiting): stop here
            try:
                self._start(step, obj, overwrite)
            except BaseException:
                if earlier is not None:  # still the next call's to raise
                    self._errors.insert(0, earlier)
                raise
            if earlier is not None:
                raise earlier
        return True

    def _take_error(self) -> BaseException | None:
        """Wait for the saves in flight (holding the lock); the first error not raised."""
        try:
            self._finish()
        except BaseException as error:
            return error
        return None

    def _start(self, step: int, obj: Any, overwrite: bool) -> None:
        """Write ``step`` (holding the lock), in the background with ``async_``."""
        path = self._path(step)
        if path.exists() and not overwrite:
            raise CheckpointExistsError(
                f"step {step} already exists in '{self.directory}'; pass overwrite=True "
                "to replace it"
            )
        prepared = _directory.prepare(obj, snapshot=self.async_)
        if not self.async_:
            self._write(prepared, step, overwrite)
            return
        future: concurrent.futures.Future = concurrent.futures.Future()

        def write() -> None:
            future.set_running_or_notify_cancel()
            try:
                self._write(prepared, step, overwrite)
            except BaseException as error:  # reported by the next call, or at exit
                future.set_exception(error)
            else:
                future.set_result(None)

        # A thread of its own (not a daemon: Python waits for it), not an executor:
        # while Python exits neither may take new work, and the save is then written
        # here instead (``_threads``).
        thread = threading.Thread(target=write, name=f"jm-checkpoint step {step}")
        _inflight.track(future, f"step {step} to '{path}'")
        self._pending.append(future)
        if not _threads.start(thread):
            write()

    def _write(self, prepared: _directory.Prepared, step: int, overwrite: bool) -> None:
        try:
            _directory.write(prepared, self._path(step), overwrite=overwrite)
        except CheckpointExistsError:
            raise CheckpointExistsError(
                f"step {step} was saved to '{self.directory}' by another writer while this "
                f"manager was saving it; this manager's step {step} was discarded and the other "
                "one kept. Only one CheckpointManager (one process) should save to a directory "
                "at a time: give each run its own directory."
            ) from None
        if self.max_to_keep is not None and _leads():
            for old in self.all_steps()[: -self.max_to_keep]:
                _atomic.delete(self._path(old))
        _barrier("jm-checkpoint-manager-saved")  # every process sees the tidied directory

    def wait_until_finished(self) -> None:
        """Block until every save in flight is on disk; raise the error of one that failed.

        Each failed background save raises once, from whichever thread's call
        (``wait_until_finished``, ``save``, ``restore`` or ``close``) comes
        next; when several failed, the next calls raise the others in turn.
        """
        with self._lock:
            self._finish()

    def _finish(self) -> None:
        """Wait for the saves in flight (holding the lock); raise the first error not raised."""
        pending, self._pending = self._pending, []
        for future in pending:
            try:
                future.result()
            except BaseException as error:  # KeyboardInterrupt in the writer too
                self._errors.append(error)
            finally:
                _inflight.forget(future)
        if self._errors:
            raise self._errors.pop(0)

    def restore(self, step: int | None = None, map_location: Any = None) -> Any:
        """Load ``step`` (default: the latest complete one); see ``jm.load``.

        Raises:
            CheckpointNotFoundError: no (such) complete step.
            CorruptCheckpointError: the step's data does not match its checksums.
        """
        self.wait_until_finished()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise CheckpointNotFoundError(f"no complete checkpoint in '{self.directory}'")
        elif not self._path(step).exists():
            raise CheckpointNotFoundError(
                f"no checkpoint of step {step} in '{self.directory}' (steps: {self.all_steps()})"
            )
        return _directory.read(self._path(step), map_location)

    def close(self) -> None:
        """Finish the save in flight (its thread then ends)."""
        with self._lock:
            self._finish()

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
