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
RUN_ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test proto venv clean

run: $(STAMP)
	$(BIN)/magic local $(RUN_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

proto: $(STAMP)
	$(BIN)/python proto/generate.py

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_FLAGS) --upgrade pip
	$(BIN)/python -m pip install $(PIP_FLAGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install $(PIP_FLAGS) -e ".[dev]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) .magic
