"""Random-number generators: PyTorch's seeding API over JAX keys.

A :class:`Generator` holds one JAX PRNG key. Each draw splits it: the
generator keeps one half and the draw uses the other, so a sequence of draws
is a pure function of the seed. Compiled code (``model.compile()``,
``jm.compile``) threads the default generator's key in and out of the program,
so compiled and eager runs draw the same numbers in the same order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jmodule import _threefry
from jmodule._lowering import state
from jmodule._lowering import tape as _tape
from jmodule._placement import factory as _factory

__all__ = ["Generator", "default_generator", "initial_seed", "manual_seed", "seed"]

_DEFAULT_SEED = 67280421310721  # PyTorch's default seed


def _make_key(seed: int) -> jax.Array:
    # A raw uint32 key (not a typed key array): it crosses jax.jit boundaries
    # on the C++ fast path, which typed keys do not. Made on the host where
    # JAX's PRNG is threefry (no seeding program to compile).
    if _threefry.available():
        return jax.device_put(_threefry.seed_key(seed % (1 << 32)))
    return jax.random.PRNGKey(seed % (1 << 32))


class Generator:
    """An explicit random stream, as ``torch.Generator``.

    Args:
        device: accepted for PyTorch compatibility; keys are placed by JAX.

    >>> import jmodule as jm
    >>> g = jm.Generator().manual_seed(0)
    >>> g.initial_seed()
    0
    """

    def __init__(self, device: object = None):
        self.device = device
        self._seed = _DEFAULT_SEED
        # Made on first use, so that ``import jmodule`` does not start JAX's
        # backends (``jax.distributed.initialize`` must run before they start).
        self._key = None

    def __getstate__(self) -> dict:
        return state.without_private(self.__dict__)

    def manual_seed(self, seed: int) -> Generator:
        """Reseed; returns the generator, as PyTorch does."""
        seed = int(seed)
        self._seed = seed
        self._key = None
        return self

    def seed(self) -> int:
        """Seed from a non-deterministic source and return the seed."""
        import secrets

        return self.manual_seed(secrets.randbits(63))._seed

    def initial_seed(self) -> int:
        """The seed last set."""
        return self._seed

    def materialize(self) -> jax.Array:
        """The current key, made from the seed if no draw has happened yet."""
        if self is default_generator:
            state.using_generator(self)
        if self._key is None:
            with state.lock(self):  # made once: a second thread must not reset the stream
                if self._key is None:
                    with jax.ensure_compile_time_eval():  # concrete even inside a trace
                        self._key = _make_key(self._seed)
        return self._key

    def get_state(self) -> jax.Array:
        """The raw key data (a uint32 array), for saving."""
        return self.materialize()

    def set_state(self, state: jax.Array) -> None:
        """Restore a state returned by :meth:`get_state`."""
        if self is default_generator:
            state.using_generator(self)
        self._key = jnp.asarray(state, dtype=jnp.uint32)

    def next_key(self) -> jax.Array:
        """Split off and return a fresh key, advancing the stream.

        Raises:
            RuntimeError: the new key would be a traced value that escapes
                its trace: an explicit generator used inside compiled code, or
                any draw inside a JAX transformation jmodule does not manage.
        """
        with state.lock(self):  # two threads drawing at once take different keys
            new, sub = _tape.untaped(_split, self.materialize())
            if isinstance(new, jax.core.Tracer) and not state.is_bound(self.__dict__):
                if self is not default_generator and state.tracing():
                    raise RuntimeError(_EXPLICIT_IN_TRACE)
                raise RuntimeError(_FOREIGN_TRACE)
            self._key = new
        return sub

    def _next_host_key(self) -> np.ndarray | None:
        """:meth:`next_key` split on the host (:mod:`jmodule._threefry`): the same key as a
        NumPy array, with no program; None where the key is not a concrete CPU array or JAX
        draws otherwise (the caller then uses :meth:`next_key`)."""
        if not _threefry.available():
            return None
        with state.lock(self):
            key = self.materialize()
            if isinstance(key, jax.core.Tracer) or not _factory.on_one_cpu(key):
                return None
            new, sub = _threefry.split(np.asarray(key))
            self._key = jax.device_put(new, key.sharding if key.committed else None)
        return sub


@functools.partial(jax.jit, inline=True)
def _split(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``jax.random.split(key)`` as one compiled program: ``(kept half, drawn half)``."""
    both = jax.random.split(key)
    return both[0], both[1]


_EXPLICIT_IN_TRACE = (
    "An explicit jm.Generator was used inside compiled code. Only the default generator "
    "(seeded by jm.manual_seed) is threaded through compiled programs; draw from it instead, "
    "or pass keys in as arguments."
)
_FOREIGN_TRACE = (
    "A random draw (dropout, init, ...) happened inside a JAX transformation that jmodule "
    "does not manage (e.g. a bare jax.jit or jax.grad around a module call), so the "
    "generator's new key would leak out of the trace. Compile with model.compile() or "
    "jm.compile(fn), which thread the key in and out; pass rng_key= to "
    "jm.func.functional_call; or run the module eagerly."
)

default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator, as ``torch.manual_seed``.

    >>> import jmodule as jm
    >>> _ = jm.manual_seed(0)
    """
    return default_generator.manual_seed(seed)


def seed() -> int:
    """Seed the default generator non-deterministically; returns the seed."""
    return default_generator.seed()


def initial_seed() -> int:
    """The default generator's seed."""
    return default_generator.initial_seed()


def next_key(generator: Generator | None = None) -> jax.Array:
    """A fresh key from ``generator`` or the default generator."""
    return (generator or default_generator).next_key()
