# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and (re)installs nearsight when pyproject.toml changed;
# a second run skips what is already installed.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv lint clean

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --progress-bar off -e '.[dev]'
	touch $@

demo: venv
	$(BIN)/nearsight demo

lint: venv
	$(BIN)/ruff check .

test: venv
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache
