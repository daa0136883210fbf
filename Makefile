# The two commands of the README: `make up` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test lint typecheck unit bench clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tuneloop needs Python 3.11 or newer")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -q -e '.[dev,agent,demo]'
	@touch $@

## Install and run the whole control plane on the embedded default (SQLite, no servers).
up: $(VENV)/.installed
	$(BIN)/tuneloop up

## Install and run the whole test suite: lint, types, and tests on real PostgreSQL and SQLite.
test: $(VENV)/.installed
	.ci/ensure-services
	.ci/ensure-tools
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest

bench: $(VENV)/.installed
	$(BIN)/python bench/storage_write.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
