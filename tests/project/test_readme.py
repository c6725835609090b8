"""The README's Python example runs as written."""

import re

import pytest
from _paths import ROOT


@pytest.mark.slow
def test_readme_python_blocks_run():
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has a Python example"
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, "README.md", "exec"), namespace)
        if "step" in namespace and "model" in namespace:
            loss = namespace["step"](namespace["model"], namespace["x"])
            assert loss.shape == ()
