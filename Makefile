# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: demo test bench lint format clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e ".[demo]"
	touch $@

$(VENV)/.test-installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install --quiet -e ".[test,demo,bench,dev]"
	touch $@

demo: $(VENV)/.demo-installed
	$(PY) examples/demo.py

test: $(VENV)/.test-installed
	$(PY) -m pytest

bench: $(VENV)/.test-installed
	$(PY) benchmarks/dispatch.py
	$(PY) benchmarks/train_step.py
	$(PY) benchmarks/threads.py
	$(PY) benchmarks/checkpoint.py
	$(PY) benchmarks/sharding.py
	$(PY) benchmarks/conv.py
	$(PY) benchmarks/scan.py
	$(PY) benchmarks/eager.py
	$(PY) benchmarks/soak.py
	$(PY) benchmarks/readme_table.py

lint: $(VENV)/.test-installed
	$(PY) -m ruff format --check jmodule tests benchmarks examples
	$(PY) -m ruff check jmodule tests benchmarks examples

format: $(VENV)/.test-installed
	$(PY) -m ruff format jmodule tests benchmarks examples
	$(PY) -m ruff check --fix jmodule tests benchmarks examples

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
