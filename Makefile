# Two commands on a fresh machine: `make demo` and `make test`.
# Each creates .venv when missing and (re)installs nearsight when pyproject.toml or
# constraints.txt changed; a second run skips what is already installed. constraints.txt pins
# the versions the tests last passed with (pip freeze of the passing venv).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test venv lint clean browser gpu-check docs

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/python -m pip install --quiet --progress-bar off -c constraints.txt -e '.[dev]' --config-settings editable_mode=compat
	touch $@

demo: venv
	$(BIN)/nearsight demo

# The GPU path in one command (bench/gpu_check.py --help); GPU_CHECK_ARGS=--cpu-smoke on a CPU.
gpu-check: venv
	$(BIN)/python bench/gpu_check.py --json gpu_check.json $(GPU_CHECK_ARGS)

# The docs site at http://127.0.0.1:8000, rebuilt as the pages change (optional: `make test`
# builds it with `mkdocs build --strict`, tests/docs/test_site.py).
docs: venv
	$(BIN)/mkdocs serve

lint: venv
	$(BIN)/ruff check .

# The suite on one pytest-xdist worker per core, at most 4 (most tests wait on a server, a
# training subprocess or a build); a test file runs whole on one worker: its module fixtures
# are built once and a document's examples share one namespace. PYTEST_WORKERS=0: one process.
# One torch / onnxruntime / FAISS thread per worker (and its subprocesses) unless set: with a
# worker per core, a thread per core in each worker made the training tests wait on each
# other (tests/training's two slowest files: 163 s on 2 cores, 79 s with one thread each).
# Bytecode is written even where PYTHONDONTWRITEBYTECODE is set (as on this workplace's machines):
# without it each worker re-rewrote every test module and pytest plugin at collection, and
# each of the suite's subprocesses recompiled nearsight (the caches are git-ignored).
PYTEST_WORKERS ?= auto
# The type checker covers the whole package; pyproject.toml's [tool.mypy] holds its settings.
TYPED := nearsight
test: venv browser
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy $(TYPED)
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/pytest -n $(PYTEST_WORKERS) --maxprocesses 4 --dist loadfile

# The page's browser tests drive Debian's chromium through Playwright (never `playwright
# install`: no internet). Installed here when missing; without apt-get they are skipped.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
browser:
	@if [ ! -x /usr/bin/chromium ]; then \
		if command -v apt-get >/dev/null; then \
			$(SUDO) apt-get update && \
			$(SUDO) env DEBIAN_FRONTEND=noninteractive \
				apt-get install -y --no-install-recommends chromium; \
		else \
			echo "no /usr/bin/chromium and no apt-get: the browser tests will be skipped"; \
		fi; \
	fi

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .ruff_cache site
