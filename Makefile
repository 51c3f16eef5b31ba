# Hydra node: the two set-up commands are `make serve` and `make test`; both build on `make install`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
LLAMA_VERSION := 0.3.36
# GPU backend of llama.cpp: empty (CPU), cuda or vulkan — `make install GPU=cuda`. Each flavour
# builds into its own cached wheel; RPC is always on.
GPU ?=
ifeq ($(GPU),)
GPU_CMAKE :=
else ifeq ($(GPU),cuda)
GPU_CMAKE := -DGGML_CUDA=on
GPU_TOOL := nvcc
else ifeq ($(GPU),vulkan)
GPU_CMAKE := -DGGML_VULKAN=on
GPU_TOOL := glslc
else
$(error GPU=$(GPU) is not a backend we build: use GPU=cuda, GPU=vulkan, or no GPU for the CPU build)
endif
FLAVOUR := rpc$(if $(GPU),-$(GPU))
# A wheelhouse keyed by version *and* build flags, so a cached non-RPC (or other-backend) wheel can
# never be picked up.
WHEELHOUSE ?= $(HOME)/.cache/hydra-node/wheels/llama-cpp-python-$(LLAMA_VERSION)-$(FLAVOUR)
STAMP := $(VENV)/.hydra-installed-$(FLAVOUR)
# The native tunnel pump (hydra_node/runtime/rpc/native_pump.py); without it tunnels use a Python pump.
PUMP_SO := hydra_node/native/_pump.so
CC ?= cc

.PHONY: install serve test test-fast bench clean lint format

install: $(STAMP) $(PUMP_SO)

$(PUMP_SO): hydra_node/native/pump.c
	$(CC) -O2 -Wall -Wextra -shared -fPIC -o $@ $<

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install -q --disable-pip-version-check --upgrade pip setuptools wheel
	@if ! ls $(WHEELHOUSE)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1; then \
	  if [ -n "$(GPU_TOOL)" ] && ! command -v $(GPU_TOOL) >/dev/null 2>&1; then \
	    echo "GPU=$(GPU) needs $(GPU_TOOL) on PATH (the $(GPU) toolkit) to build llama.cpp's $(GPU) backend"; exit 1; \
	  fi; \
	  echo "==> building llama-cpp-python $(LLAMA_VERSION) with -DGGML_RPC=on $(GPU_CMAKE) (about 3 minutes on 2 cores for the CPU build, once)"; \
	  mkdir -p $(WHEELHOUSE) && \
	  CMAKE_ARGS="-DGGML_RPC=on -DGGML_NATIVE=off $(GPU_CMAKE)" $(PIP) wheel -q --disable-pip-version-check --no-deps --no-cache-dir \
	    --no-binary llama-cpp-python -w $(WHEELHOUSE) llama-cpp-python==$(LLAMA_VERSION) || exit 1; \
	fi
	@rm -f $(VENV)/.hydra-installed*  # one flavour at a time: the wheel below replaces the other's
	@$(PIP) install -q --disable-pip-version-check --force-reinstall --find-links $(WHEELHOUSE) --no-index --no-deps llama-cpp-python==$(LLAMA_VERSION) 2>/dev/null \
	  || $(PIP) install -q --disable-pip-version-check --force-reinstall --find-links $(WHEELHOUSE) llama-cpp-python==$(LLAMA_VERSION)
	@$(PIP) install -q --disable-pip-version-check --find-links $(WHEELHOUSE) -e '.[test]'
	@$(PY) -c "import llama_cpp, sys; ok = llama_cpp.llama_supports_rpc(); print('llama-cpp-python', llama_cpp.__version__, 'RPC:', ok); sys.exit(0 if ok else 1)" \
	  || { echo "llama-cpp-python was built without RPC; removing the cached wheel, run make install again"; rm -rf $(WHEELHOUSE); exit 1; }
	@touch $(STAMP)

serve: install
	$(VENV)/bin/hydra-node serve

# --durations: the slowest tests at the end of every run (the suite's time budget is watched there).
test: install
	$(PY) -m pytest -q --durations=30

# The inner loop: everything but the tests that start real processes or load the model.
test-fast: install
	$(PY) -m pytest -q -m "not live"

# ruff with the rule set in pyproject.toml ([tool.ruff.lint]), the formatter's check, then mypy on
# what [tool.mypy] names. `make format` rewrites the files the check would refuse.
LINTED := hydra_node tests bench protocol
lint: install
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(PY) -m mypy

format: install
	$(VENV)/bin/ruff format $(LINTED)

bench: install
	$(PY) bench/api_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info $(PUMP_SO)
