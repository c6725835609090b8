"""The named tuples ``jm.max(x, dim)``, ``jm.sort``, ``jm.topk``, ... return, as
``torch.return_types``: ``jm.return_types.max`` has the fields ``values`` and
``indices``. The module's ``__getattr__`` serves them (``max``, ``min`` and
``sort``'s names must not rebind Python's builtins here).

>>> import jmodule as jm
>>> jm.return_types.topk._fields
('values', 'indices')
"""

from __future__ import annotations

from jmodule._torch_functions import RETURN_TYPES as _RETURN_TYPES


def __getattr__(name: str) -> type:
    try:
        return _RETURN_TYPES[name]
    except KeyError:
        raise AttributeError(f"module 'jmodule.return_types' has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted({*globals(), *_RETURN_TYPES})
