"""JAX's persistent compilation cache, on by default in the user's cache directory.

Eager jmodule code runs as cached compiled programs (one or two per layer and
shape); compiling them is most of a notebook's first step. With the cache on,
a restarted notebook (or the next run of a script) loads them from disk
instead of compiling them again.

On ``import jmodule`` the cache is set to ``$JMODULE_COMPILATION_CACHE`` if
that names a directory, else to ``$XDG_CACHE_HOME/jmodule/xla`` (by default
``~/.cache/jmodule/xla``), with every program cached however quickly it
compiled. Its size is not bounded (JAX's eviction is not safe for several
processes sharing a directory): delete the directory to empty it. It is left
alone when JAX's cache is already configured (the
``JAX_COMPILATION_CACHE_DIR`` variable, or ``jax.config`` before the import),
and is off when ``JMODULE_COMPILATION_CACHE`` is ``0``, ``off``, ``false``
or ``no``. :func:`set_compilation_cache` changes it at run time.

A multi-process job (``jm.distributed.init()``) runs without the default
cache: JAX 0.12.1 hangs in the first call of a program with cross-process
collectives that it loaded from the persistent cache (a plain ``jax.jit``
step over gloo, run twice, hangs the second time; JAX 0.10 does not).
``init`` turns off the cache ``import jmodule`` turned on (a cache the user
set, before or after the import, is left alone); ``set_compilation_cache``
after ``init`` turns it on again.
"""

from __future__ import annotations

import os
import tempfile
import warnings

import jax

__all__ = ["compilation_cache_dir", "set_compilation_cache"]

_OFF = frozenset({"0", "off", "false", "no", "none"})


def default_dir() -> str:
    """``$XDG_CACHE_HOME/jmodule/xla``, else ``~/.cache/jmodule/xla``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "jmodule", "xla")


def _configure(path: str | None) -> None:
    jax.config.update("jax_compilation_cache_dir", path)
    if path is None:
        return
    # Eager programs compile in milliseconds: JAX's default keeps only those over 1 s
    # (a value the user set is kept, as is a size limit).
    # JAX's size limit is not set: its eviction races when several processes share the
    # directory (a file another process evicted raises FileNotFoundError mid-compile).
    if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _unwritable(path: str) -> str | None:
    """Why ``path`` cannot hold the cache (made if missing), or None if it can."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


_UNWRITABLE = (
    "the compilation cache directory {path!r} cannot be written ({why}). {then} Set "
    "JMODULE_COMPILATION_CACHE to a writable directory, or to 0 to turn the cache off."
)


def configure_default() -> None:
    """What ``import jmodule`` does (see the module docstring)."""
    setting = os.environ.get("JMODULE_COMPILATION_CACHE")
    if setting is not None and setting.strip().lower() in _OFF:
        return
    if jax.config.jax_compilation_cache_dir:
        return  # configured already, by the user
    path = setting.strip() if setting and setting.strip() else default_dir()
    why = _unwritable(path)
    if why is not None:  # said once, instead of JAX's warning on every compile
        then = "jmodule runs without it (every new program compiles)."
        warnings.warn(_UNWRITABLE.format(path=path, why=why, then=then), stacklevel=2)
        return
    _configure(path)
    global _DEFAULT
    _DEFAULT = path


# The directory configure_default set: the cache a multi-process job turns off.
_DEFAULT: str | None = None


def leave_default_for_multiprocess() -> bool:
    """In a multi-process job, turn off the cache ``import jmodule`` turned on.

    Returns:
        Whether it was on by jmodule's default and is now off (a cache the
        user configured is left as it is).
    """
    global _DEFAULT
    if _DEFAULT is None or jax.config.jax_compilation_cache_dir != _DEFAULT:
        return False
    from jax.experimental.compilation_cache import compilation_cache

    _DEFAULT = None
    jax.config.update("jax_compilation_cache_dir", None)
    compilation_cache.reset_cache()
    return True


def compilation_cache_dir() -> str | None:
    """The directory of JAX's persistent compilation cache, or None when it is off.

    >>> import jmodule as jm
    >>> isinstance(jm.compilation_cache_dir(), (str, type(None)))
    True
    """
    return jax.config.jax_compilation_cache_dir or None


def set_compilation_cache(path: str | os.PathLike | None) -> None:
    """Put JAX's persistent compilation cache in ``path``, or turn it off with None.

    Programs compiled from then on are looked up and stored there (so a
    restarted process compiles nothing it compiled before). The cache is on
    by default in ``~/.cache/jmodule/xla`` (see ``JMODULE_COMPILATION_CACHE``
    in the README to change or disable it before import).

    Raises:
        OSError: ``path`` cannot be made or written (the setting is unchanged).

    >>> import jmodule as jm
    >>> before = jm.compilation_cache_dir()
    >>> jm.set_compilation_cache(None)
    >>> jm.compilation_cache_dir() is None
    True
    >>> jm.set_compilation_cache(before)
    """
    from jax.experimental.compilation_cache import compilation_cache

    if path is not None:
        path = os.fspath(path)
        why = _unwritable(path)
        if why is not None:
            raise OSError(_UNWRITABLE.format(path=path, why=why, then="Nothing changed."))
    global _DEFAULT
    _DEFAULT = None  # the user's choice from now on
    _configure(path)
    compilation_cache.reset_cache()  # the next compile opens the new directory
