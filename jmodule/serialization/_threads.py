"""Threads that saving and loading start, and what they do while Python exits.

Saves run at exit: the background saves ``_inflight`` finishes then, and saves
a user's ``atexit`` handler makes. Two things refuse new work by then:

- ``concurrent.futures`` executors, on every Python: its own exit hook has run
  ("cannot schedule new futures after interpreter shutdown");
- ``threading.Thread.start`` on Python 3.12, from the moment shutdown begins
  ("can't create new thread at interpreter shutdown"); 3.11 and 3.13 allow it.

So the serialization code starts its threads here, never through an executor:
where a thread cannot start, its work runs on the calling thread instead (the
same result, only without the overlap).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def start(thread: threading.Thread) -> bool:
    """Start ``thread`` (new, never started); False where Python refuses: it is exiting."""
    try:
        thread.start()
    except RuntimeError:  # a new thread's only RuntimeError: the interpreter is exiting
        return False
    return True


def each(fn: Callable[[Any], None], items: Sequence[Any], name: str) -> None:
    """``fn(item)`` for every item, one thread each but the first (run here); raises the
    first error any of them raised, once all are done."""
    errors: list[BaseException] = []

    def run(item: Any) -> None:
        try:
            fn(item)
        except BaseException as error:
            errors.append(error)

    threads = []
    for item in items[1:]:
        thread = threading.Thread(target=run, args=(item,), name=name)
        if start(thread):
            threads.append(thread)
        else:
            run(item)
    if items:
        run(items[0])
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
