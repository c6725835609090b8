"""Every ``>>>`` example in jmodule's docstrings runs and prints what it shows.

One test per module of the package (each ``.py`` file under ``jmodule/`` with
a ``>>>`` prompt) runs all of that module's examples: the module's own
docstring, its classes, functions, methods and properties, as
``doctest.DocTestFinder`` finds them. They share this process, so an op that
examples in several modules call is compiled once.

The examples of ``jmodule.distributed`` shard over 8 devices. They run
together in one subprocess on 8 simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8``, which JAX reads when
it starts), as the 8-device checks of ``test_distributed.py`` do; this file is
that subprocess's script (``python tests/test_docstrings.py REPORT MODULE...``).

An example that prints a float rounds it (``.round(4)``, ``round(x, 4)``) or
prints a shape, a dtype or a boolean instead: the last bits of a float differ
between CPUs (vector width, FMA, the ``exp``/``rsqrt`` approximations).
"""

import doctest
import importlib
import inspect
import io
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jmodule"
FLAGS = doctest.NORMALIZE_WHITESPACE
EIGHT_DEVICES = 8
PROMPT = re.compile(r"^\s*>>>", re.M)
# A float shown to more than 4 decimals ("-1.3416394", "0.6931472"): its last
# digits depend on the CPU.
LONG_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{5,}")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _prompts() -> dict[str, int]:
    """``{module name: number of >>> prompts in its source}`` for modules with examples."""
    counts = {_module_name(p): len(PROMPT.findall(p.read_text())) for p in PACKAGE.rglob("*.py")}
    return {name: n for name, n in sorted(counts.items()) if n}


PROMPTS = _prompts()


def _needs_eight_devices(name: str) -> bool:
    return name == "jmodule.distributed" or name.startswith("jmodule.distributed.")


class _Finder(doctest.DocTestFinder):
    """``DocTestFinder`` that locates a decorated function by its own code.

    Before Python 3.13 it takes the line of the wrapper's code (``functools.wraps``
    in ``nn.functional``'s ``jit``), so every failure in a module pointed at one line.
    """

    def _find_lineno(self, obj, source_lines):
        if inspect.isfunction(obj):
            obj = inspect.unwrap(obj)
        return super()._find_lineno(obj, source_lines)


def _examples(name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(name)
    return [t for t in _Finder().find(module, name) if t.examples]


def run_examples(name: str) -> dict:
    """Run every example of module ``name``; ``tempfile`` writes under a fresh directory.

    Returns:
        ``{"found": examples found, "attempted": examples run (not skipped),
        "failed": examples that failed, "report": doctest's failure report}``.
    """
    tests = _examples(name)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    out = io.StringIO()
    saved = tempfile.tempdir
    with tempfile.TemporaryDirectory() as scratch:
        tempfile.tempdir = scratch
        try:
            for test in tests:
                runner.run(test, out=out.write)
        finally:
            tempfile.tempdir = saved
    failed, attempted = runner.summarize(verbose=False)
    found = sum(len(t.examples) for t in tests)
    return {"found": found, "attempted": attempted, "failed": failed, "report": out.getvalue()}


@pytest.fixture(scope="module")
def eight_device_results(tmp_path_factory):
    """Run the examples of every 8-device module in one subprocess: ``{module: result}``."""
    names = [n for n in PROMPTS if _needs_eight_devices(n)]
    report = tmp_path_factory.mktemp("doctest") / "eight.json"
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={EIGHT_DEVICES}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, __file__, str(report), *names],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0 or not report.exists():
        pytest.fail(
            f"the 8-device doctest run exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return json.loads(report.read_text())


@pytest.mark.parametrize("name", PROMPTS)
def test_docstring_examples(name, request):
    if _needs_eight_devices(name):
        result = request.getfixturevalue("eight_device_results")[name]
    else:
        result = run_examples(name)
    assert result["failed"] == 0, f"{name}: {result['failed']} example(s) failed\n" + (
        result["report"]
    )
    # Every prompt in the source is an example doctest found and ran: none hides in an
    # object the finder does not reach, and none is skipped (``# doctest: +SKIP``).
    assert result["found"] == PROMPTS[name], (
        f"{name} has {PROMPTS[name]} '>>>' prompts but doctest found {result['found']} examples"
    )
    assert result["attempted"] == result["found"], (
        f"{name}: {result['found'] - result['attempted']} example(s) skipped; make them run here"
    )


def test_no_example_shows_a_float_to_its_last_digits():
    long = []
    for name in PROMPTS:
        for test in _examples(name):
            for example in test.examples:
                shown = LONG_FLOAT.findall(example.want + (example.exc_msg or ""))
                if shown:
                    where = f"{Path(test.filename).relative_to(ROOT)}:{(test.lineno or 0) + example.lineno + 1}"
                    long.append(f"{where} ({test.name}) shows {', '.join(shown)}")
    assert not long, (
        "these examples show floats to more than 4 decimals, whose last digits differ "
        "between CPUs; round them (x.round(4), round(float(x), 4)) or show a shape, dtype or "
        "boolean instead:\n" + "\n".join(long)
    )


if __name__ == "__main__":
    import warnings

    import conftest  # noqa: F401  (the tests' JAX settings: CPU, persistent compilation cache)

    warnings.simplefilter("error")  # as pytest's filterwarnings does in this process

    results = {name: run_examples(name) for name in sys.argv[2:]}
    Path(sys.argv[1]).write_text(json.dumps(results))
