"""Background saves in flight, finished before the interpreter exits.

A script that ends (falls off its end, calls ``sys.exit``, or dies of an
exception) while ``CheckpointManager`` still writes in the background must
not lose that checkpoint, nor its error. At exit Python first calls the
hooks registered with ``threading._register_atexit``, newest first, then
joins non-daemon threads, then runs ``atexit`` handlers. ``concurrent.futures``
registers such a hook when it is imported, and from then on refuses new work
("cannot schedule new futures after shutdown"), which Orbax's writer needs.
This module imports ``concurrent.futures.thread`` before registering its own
hook, so that hook runs first and waits for every save still in flight while
the writers still work.

A save that fails is reported on stderr (which step, where, the traceback).
Then the process exits with status 1, once every ``atexit`` handler has run,
so a job scheduler sees the failure (the exit status is fixed before exit
hooks run; only ``os._exit`` can still change it).

Saves are tracked until their outcome is taken (``wait_until_finished``), so
a failure is reported even if its manager was dropped before the exit. A
forked child forgets its parent's saves: their threads do not exist in it.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import concurrent.futures.thread  # registers its exit hook before ours: ours runs first
import os
import sys
import threading
import traceback

_lock = threading.Lock()
_in_flight: dict[concurrent.futures.Future, str] = {}
_failed = False


def track(future: concurrent.futures.Future, what: str) -> None:
    """Wait for ``future`` at exit, reporting its error as the save of ``what``."""
    with _lock:
        _in_flight[future] = what


def forget(future: concurrent.futures.Future) -> None:
    """Stop tracking ``future``: its outcome has been taken by the caller."""
    with _lock:
        _in_flight.pop(future, None)


def _report(what: str, error: BaseException) -> None:
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    sys.stderr.write(
        f"jm.checkpoint: the background save of {what} failed while Python was exiting; "
        f"that checkpoint was not saved.\n{''.join(lines)}"
        "The process exits with status 1. Call CheckpointManager.wait_until_finished() "
        "(or close()) before exiting to handle such errors yourself.\n"
    )
    sys.stderr.flush()


def finish_all() -> None:
    """Wait for every tracked save; report each failure on stderr."""
    global _failed
    while True:
        with _lock:
            pending = list(_in_flight.items())
            _in_flight.clear()
        if not pending:
            return
        for future, what in pending:
            try:
                future.result()
            except BaseException as error:  # KeyboardInterrupt too: say so
                _report(what, error)
                if not _failed:
                    _failed = True
                    atexit.register(_exit_failed)


def _exit_failed() -> None:
    """Run the other ``atexit`` handlers, then exit with status 1."""
    atexit.unregister(_exit_failed)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(1)


def _forget_all() -> None:
    global _lock
    _lock = threading.Lock()
    _in_flight.clear()


os.register_at_fork(after_in_child=_forget_all)
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(finish_all)
else:  # not CPython: atexit runs later than concurrent.futures' hook, but still reports
    atexit.register(finish_all)
