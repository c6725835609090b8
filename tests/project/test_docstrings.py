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
that subprocess's script (``python tests/project/test_docstrings.py REPORT MODULE...``).

An example that prints a float rounds it (``.round(4)``, ``round(x, 4)``) or
prints a shape, a dtype or a boolean instead: the last bits of a float differ
between CPUs (vector width, FMA, the ``exp``/``rsqrt`` approximations).
Rounding alone does not make them equal: ``jnp.round(x, 4)`` divides by
``10**4`` on the device, and XLA's CPU division is not correctly rounded
(``jnp.float32(6000) / 10000`` prints ``0.59999996``), so one CPU may show
``0.6`` and another ``0.59999996``. The examples' floats are therefore
compared as float32 values (to a few units in the last place), not as text:
see :class:`_Float32Checker`.
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
from _paths import PACKAGE, ROOT, TESTS

FLAGS = doctest.NORMALIZE_WHITESPACE
EIGHT_DEVICES = 8
PROMPT = re.compile(r"^\s*>>>", re.M)
# A float shown to more than 4 decimals ("-1.3416394", "0.6931472"): its last
# digits depend on the CPU.
LONG_FLOAT = re.compile(r"(?<![\w.])-?\d+\.\d{5,}")


# A float as numpy and Python print one: "0.6931", "-1.", "100.", "1e-05", "nan".
NUMBER = re.compile(r"(?<![\w.])-?(?:\d+\.\d*(?:e[+-]?\d+)?|\d+e[+-]?\d+)")
# Relative (and absolute, near zero) tolerance: 8 float32 ulps at 1.0.
FLOAT32_TOL = 8 * 2.0**-23


class _Float32Checker(doctest.OutputChecker):
    """Output checker that compares the floats of an example as float32 values.

    The expected and the printed output must be the same text once every float
    in them is taken out (whitespace aside: numpy aligns columns to the widest
    number), and each printed float must be within :data:`FLOAT32_TOL` (relative,
    or absolute near zero) of the expected one at the same place. Integers,
    shapes, dtypes and all other text still compare exactly.
    """

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        wanted, printed = NUMBER.findall(want), NUMBER.findall(got)
        if not wanted or len(wanted) != len(printed):
            return False
        if _skeleton(want) != _skeleton(got):
            return False
        return all(_close(float(w), float(g)) for w, g in zip(wanted, printed))


def _skeleton(text: str) -> str:
    return re.sub(r"\s+", "", NUMBER.sub("#", text))


def _close(want: float, got: float) -> bool:
    return abs(want - got) <= FLOAT32_TOL * max(1.0, abs(want))


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
    runner = doctest.DocTestRunner(checker=_Float32Checker(), optionflags=FLAGS)
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
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(TESTS), env.get("PYTHONPATH")) if p
    )
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


@pytest.mark.slow
@pytest.mark.parametrize("name", PROMPTS)
def test_docstring_examples(name, request):
    if _needs_eight_devices(name):
        result = request.getfixturevalue("eight_device_results")[name]
    else:
        result = run_examples(name)
    assert result["failed"] == 0, (
        f"{name}: {result['failed']} example(s) failed\n" + (result["report"])
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
                    line = (test.lineno or 0) + example.lineno + 1
                    where = f"{Path(test.filename).relative_to(ROOT)}:{line}"
                    long.append(f"{where} ({test.name}) shows {', '.join(shown)}")
    assert not long, (
        "these examples show floats to more than 4 decimals, whose last digits differ "
        "between CPUs; round them (x.round(4), round(float(x), 4)) or show a shape, dtype or "
        "boolean instead:\n" + "\n".join(long)
    )


def test_float32_checker_ignores_only_the_last_bits():
    check = _Float32Checker().check_output
    flags = FLAGS
    # The case: one CPU prints -1.3416394, another -1.3416393; XLA's division
    # leaves jnp.round(0.6, 4) at 0.59999996 on some.
    assert check(
        "Array([-1.3416394, 0.5], dtype=float32)\n",
        "Array([-1.3416393, 0.5], dtype=float32)\n",
        flags,
    )
    assert check(
        "Array([[0.6, 0.8]], dtype=float32)\n",
        "Array([[0.59999996, 0.79999995]], dtype=float32)\n",
        flags,
    )
    assert check(
        "Array([  0.6931, 100.    ], dtype=float32)\n",
        "Array([  0.6931, 100.], dtype=float32)\n",
        flags,
    )
    assert check("0.6931\n", "0.6931\n", flags)
    # A different value, an integer, a dtype or any other text still fails.
    assert not check(
        "Array([-1.3416], dtype=float32)\n", "Array([-1.3417], dtype=float32)\n", flags
    )
    assert not check("Array([5.], dtype=float32)\n", "Array([5.3], dtype=float32)\n", flags)
    assert not check("Array([0.6], dtype=float32)\n", "Array([0.6], dtype=bfloat16)\n", flags)
    assert not check("(2, 4)\n", "(2, 5)\n", flags)
    assert not check("Array([0.6], dtype=float32)\n", "Array([0.6, 0.6], dtype=float32)\n", flags)


if __name__ == "__main__":
    import warnings

    import conftest  # noqa: F401  (the tests' JAX settings: CPU, persistent compilation cache)

    warnings.simplefilter("error")  # as pytest's filterwarnings does in this process

    results = {name: run_examples(name) for name in sys.argv[2:]}
    Path(sys.argv[1]).write_text(json.dumps(results))
