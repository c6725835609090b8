"""``map_location``: where and in which dtype loaded arrays land.

Accepts what ``Module.to`` accepts, read by ``jmodule/_placement/parse.py``: a
device (``"cpu"``, ``"cuda:1"``, an int, ``jm.device``, ``jax.Device``), a
``jax.sharding.Sharding``, a dtype (floating and complex arrays are cast,
integer ones only move), a ``(device, dtype)`` pair, an array (its sharding
and dtype), ``"meta"`` (shapes and dtypes only, nothing read). Loading adds
two forms: a callable ``fn(array, key)`` applied to each loaded array, and a
dict giving some keys a placement of their own (``{"fc.weight": sharding}``);
the other keys go where the rest of ``map_location`` says.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from jmodule import _placement
from jmodule._placement.device import single_device_sharding
from jmodule._placement.sharding import spec_problem

_PER_KEY = (
    "a map_location dict maps checkpoint keys to where those arrays go, e.g. "
    "{'fc.weight': NamedSharding(mesh, P('model'))}"
)


def _looks_like_device(name: str) -> bool:
    return name.split(":")[0] in ("cpu", "cuda", "gpu", "tpu", "mps", "xpu", "meta")


class MapLocation:
    """A parsed ``map_location``.

    Attributes:
        where: a ``jax.Device``, a ``jax.sharding.Sharding`` or ``jm.device("meta")``.
        dtype: the dtype floating/complex arrays are cast to, or ``None``.
        fn: the callable applied to each array, or ``None``.
        per_key: placements of their own for some keys (from a dict).
    """

    def __init__(self, map_location: Any = None, *, default: bool = True):
        self.where: Any = None
        self.dtype: Any = None
        self.fn: Callable[[Any, str], Any] | None = None
        self.per_key: dict[str, MapLocation] = {}
        specs = map_location if isinstance(map_location, tuple) else (map_location,)
        for spec in specs:
            self._take(spec)
        if self.where is None and default:
            self.where = _placement.default_place()

    def _take_dict(self, spec: dict) -> None:
        for key, value in spec.items():
            if not isinstance(key, str):
                raise TypeError(f"{_PER_KEY}; got the key {key!r}, which is not a str")
            own = MapLocation(value, default=False)
            if own.per_key or own.fn is not None or own.meta:
                raise TypeError(
                    f"{_PER_KEY}: a device, sharding, dtype or (device, dtype) pair; the value "
                    f"for '{key}' ({value!r}) is a dict, a callable or 'meta'."
                )
            self.per_key[key] = own

    def check_keys(self, keys: Iterable[str], path: Any) -> None:
        """Raise if the dict part of ``map_location`` names keys the file at ``path`` lacks.

        Raises:
            ValueError: a key of the dict is not in the file.
        """
        present = set(keys)
        unknown = [k for k in self.per_key if k not in present]
        if not unknown:
            return
        hints = []
        for k in unknown[:8]:
            close = difflib.get_close_matches(k, present, n=1)
            hints.append(f"'{k}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        more = f" and {len(unknown) - 8} more" if len(unknown) > 8 else ""
        remap = (
            " PyTorch's device-to-device remapping ({'cuda:1': 'cuda:0'}) is not supported: "
            "pass the target device itself."
            if any(_looks_like_device(k) for k in unknown)
            else ""
        )
        raise ValueError(
            f"map_location names {len(unknown)} key(s) that '{path}' does not hold: "
            f"{', '.join(hints)}{more}. Keys are dotted paths as in the saved object, e.g. "
            f"{sorted(present)[:3]}.{remap}"
        )

    def _own(self, key: str | None) -> MapLocation | None:
        return self.per_key.get(key) if key is not None else None

    def _take(self, spec: Any) -> None:
        if isinstance(spec, dict):
            self._take_dict(spec)
        elif (
            callable(spec)
            and not _placement.is_dtype(spec)
            and not isinstance(spec, (jax.Device, jax.sharding.Sharding))
        ):
            self.fn = spec
        else:
            place, dtype = _placement.parse([spec], what="map_location")
            self.where = place if place is not None else self.where
            self.dtype = dtype if dtype is not None else self.dtype

    @property
    def meta(self) -> bool:
        """Whether arrays come back as ``jax.ShapeDtypeStruct`` without being read."""
        return _placement.is_meta(self.where)

    def sharding(self, shape: tuple[int, ...], key: str) -> jax.sharding.Sharding:
        """The sharding an array of ``shape`` at ``key`` is restored onto.

        Raises:
            ValueError: a given sharding cannot hold an array of that shape.
        """
        own = self._own(key)
        where = own.where if own is not None and own.where is not None else self.where
        if isinstance(where, jax.Device):
            return single_device_sharding(where)
        if isinstance(where, NamedSharding) and isinstance(where.mesh, Mesh):
            problem = spec_problem(where.spec, tuple(shape), where.mesh)
        else:
            try:
                where.shard_shape(tuple(shape))
                problem = None
            except (ValueError, IndexError) as e:
                problem = str(e)
        if problem:
            raise ValueError(
                f"map_location sharding {where} cannot hold '{key}' of shape {tuple(shape)}: "
                f"{problem}"
            )
        return where

    def cast(self, x: Any, key: str | None = None) -> Any:
        """``x`` in the requested dtype (for ``key``) if it is floating or complex."""
        own = self._own(key)
        dtype = own.dtype if own is not None and own.dtype is not None else self.dtype
        return _placement.cast_floating(x, dtype)

    def finish(self, x: Any, key: str) -> Any:
        """Cast, then apply the callable."""
        x = self.cast(x, key)
        return self.fn(x, key) if self.fn is not None else x

    def put(self, host: np.ndarray, key: str) -> Any:
        """Place a host array (with JAX's 64-bit rule applied) and finish it."""
        host = narrow(host)
        if self.meta:
            return self.finish(jax.ShapeDtypeStruct(host.shape, host.dtype), key)
        return self.finish(_placement.put(host, self.sharding(host.shape, key)), key)


def narrow(host: np.ndarray) -> np.ndarray:
    """Apply JAX's rule for 64-bit data while x64 is off (int64 -> int32, ...)."""
    if host.dtype.itemsize == 8 or host.dtype == np.complex128:
        target = jax.dtypes.canonicalize_dtype(host.dtype)
        if target != host.dtype:
            return host.astype(target)
    return host
