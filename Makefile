# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The second test environment: Python 3.12 with the newest JAX jmodule supports, no PyTorch.
# Found on PATH or under pyenv; set PYTHON312=/path/to/python3.12 to choose another.
PYTHON312 ?= $(shell for p in python3.12 $$(pyenv root 2>/dev/null)/versions/3.12*/bin/python3; do \
	"$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
VENV312 := .venv312
PY312 := $(VENV312)/bin/python

.PHONY: demo test test-fast test-311 test-312 bench lint format clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e ".[demo]"
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e ".[test,torch,demo,bench,dev]"
	touch $@

$(VENV312)/bin/python:
	@test -n "$(PYTHON312)" || { echo "make: no Python 3.12 found (PATH or pyenv); set PYTHON312=..." >&2; exit 1; }
	$(PYTHON312) -m venv $(VENV312)
	$(PY312) -m pip install --quiet --upgrade pip

# No PyTorch here: the torch file on this disk is for Python 3.11, and the registry's is a
# multi-GB CUDA build. pip takes the newest JAX that pyproject.toml allows.
$(VENV312)/.test-installed: pyproject.toml | $(VENV312)/bin/python
	$(PY312) -m pip install --quiet --upgrade -e ".[test,demo]"
	touch $@

demo: $(VENV)/.demo-installed
	$(PY) examples/demo.py

# The whole suite on Python 3.11 (JAX 0.10, PyTorch 2.13), then on Python 3.12 with the newest
# JAX every test that does not need PyTorch (the `torch` marker), the doctests and the demo.
test: test-311 test-312

test-311: $(VENV)/.test-installed
	$(PY) -m pytest

# The developer's loop: everything not marked slow, on Python 3.11 (CI runs `make test`).
test-fast: $(VENV)/.test-installed
	$(PY) -m pytest -m "not slow"

test-312: $(VENV312)/.test-installed
	JMODULE_TEST_FAST_COMPILE=0 $(PY312) -m pytest -m "not torch"
	$(PY312) examples/demo.py

bench: $(VENV)/.test-installed
	$(PY) benchmarks/dispatch.py
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/threads.py
	$(PY) benchmarks/checkpoint.py
	$(PY) benchmarks/sharding.py
	$(PY) benchmarks/conv.py
	$(PY) benchmarks/scan.py
	$(PY) benchmarks/eager.py
	$(PY) benchmarks/models.py
	$(PY) benchmarks/soak.py
	$(PY) benchmarks/readme_table.py

lint: $(VENV)/.test-installed
	$(PY) -m ruff format --check jmodule tests benchmarks examples
	$(PY) -m ruff check jmodule tests benchmarks examples

format: $(VENV)/.test-installed
	$(PY) -m ruff format jmodule tests benchmarks examples
	$(PY) -m ruff check --fix jmodule tests benchmarks examples

clean:
	rm -rf $(VENV) $(VENV312) .pytest_cache build *.egg-info
