"""Where things are, for tests at any depth of ``tests/``: the repository, the package, tests."""

from pathlib import Path

#: ``tests/``: the shared helpers (``_torch.py``, ``torch_ref.py``, ``layer_harness.py``) live here.
TESTS = Path(__file__).resolve().parent
#: The repository's root (``README.md``, ``notebooks/``, ``benchmarks/``).
ROOT = TESTS.parent
#: The ``jmodule`` package's source.
PACKAGE = ROOT / "jmodule"
