"""The ``torch`` marker says which tests need PyTorch, and the suite without PyTorch honours it."""

import os
import subprocess
import sys

import _torch
import pytest
from _paths import TESTS

MODULES = sorted(TESTS.rglob("test_*.py"))
LOSSES = "nn/layers/test_losses.py"
SERIALIZATION = "serialization/test_serialization.py"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_every_test_that_reaches_torch_is_marked(path):
    assert _torch.unmarked(path) == [], (
        f"{path.relative_to(TESTS)}: these tests use PyTorch (or a helper, fixture or parameter "
        "list that does) without the torch marker; add @pytest.mark.torch"
    )


def test_the_rule_sees_torch_through_helpers_fixtures_and_imports(tmp_path):
    path = tmp_path / "test_sample.py"
    path.write_text(
        "import pytest\n"
        "from _torch import torch\n"
        "TF = torch.nn.functional\n"
        "def helper():\n    return TF.relu\n"
        "@pytest.fixture\ndef ref():\n    return helper()\n"
        "def test_direct():\n    torch.ones(1)\n"
        "def test_helper():\n    helper()\n"
        "def test_fixture(ref):\n    pass\n"
        "def test_inner_import():\n    import torch\n"
        "@pytest.mark.parametrize('f', [TF.relu])\ndef test_params(f):\n    pass\n"
        "def test_free():\n    assert 1 + 1 == 2\n"
        "@pytest.mark.torch\ndef test_marked():\n    torch.ones(1)\n"
        "class TestGroup:\n    def test_method(self):\n        helper()\n"
    )
    assert _torch.unmarked(path) == [
        "test_direct",
        "test_helper",
        "test_fixture",
        "test_inner_import",
        "test_params",
        "TestGroup.test_method",
    ]
    path.write_text(
        "import pytest\nimport torch\npytestmark = pytest.mark.torch\n"
        + "def test_a():\n    torch.ones(1)\n"
    )
    assert _torch.module_marked_file(path)
    assert _torch.unmarked(path) == []


def test_the_stand_in_names_torch_at_import_and_raises_on_use():
    missing = _torch._Missing("torch")
    functional = missing.nn.functional  # naming an attribute at import time is fine

    class Ref(missing.nn.Module):  # so is subclassing
        pass

    with pytest.raises(ModuleNotFoundError, match=r"torch\.nn\.functional\.relu needs PyTorch"):
        functional.relu(1.0)
    with pytest.raises(
        ModuleNotFoundError, match=r"mark the test that uses it @pytest\.mark\.torch"
    ):
        Ref()


@pytest.mark.slow
def test_without_torch_marked_modules_are_not_imported_and_marked_tests_are_deselected():
    env = dict(os.environ, JMODULE_TEST_WITHOUT_TORCH="1")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "--collect-only",
            # LOSSES's folder, as a run meets it (pytest imports a file named on the
            # command line whatever pytest_ignore_collect says)
            os.path.dirname(LOSSES),
            SERIALIZATION,
        ],
        cwd=TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    collected = [line.removeprefix("tests/") for line in out.stdout.splitlines() if "::" in line]
    assert not any(line.startswith(LOSSES) for line in collected)
    serialization = [line for line in collected if line.startswith(SERIALIZATION)]
    assert serialization, out.stdout
    assert "deselected" in out.stdout, out.stdout
    import ast

    tree = ast.parse((TESTS / SERIALIZATION).read_text())
    marked = {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any(ast.unparse(d) == "pytest.mark.torch" for d in node.decorator_list)
    }
    assert marked
    for line in serialization:
        assert line.split("::")[1].split("[")[0] not in marked
