# The two commands of the README: `make up` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test lint typecheck unit bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tuneloop needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The server depends on the job-side agent's distribution (agent/), installed from this checkout.
$(VENV)/.installed-server: $(BIN)/python pyproject.toml agent/pyproject.toml
	$(BIN)/python -m pip install -q -e ./agent -e .
	@touch $@

# What the tests need besides: the dev tools, and PyTorch for the agent's DDP tests (demo).
$(VENV)/.installed-test: $(VENV)/.installed-server
	$(BIN)/python -m pip install -q -e ./agent -e '.[dev,demo]'
	@touch $@

## Install (the server only) and run the whole control plane on the embedded default.
up: $(VENV)/.installed-server
	$(BIN)/tuneloop up

## Install and run the whole test suite: lint, types, the layers of imports (docs/architecture.md),
## and tests on real PostgreSQL and SQLite, in two pytest-xdist workers (a file stays on one).
## Files go out in their collected order: xdist's default, most tests first, leaves the files of
## one long test (the demo, the DDP jobs) for the end, where one worker runs them while the
## other waits.
test: $(VENV)/.installed-test
	.ci/ensure-services
	.ci/ensure-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-logo
	$(BIN)/pytest -n 2 --dist loadfile --no-loadscope-reorder

bench: $(VENV)/.installed-server
	$(BIN)/python bench/storage_write.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
