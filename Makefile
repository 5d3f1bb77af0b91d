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

# Debian packages the tests need beyond Python: prometheus (tests/deploy/test_prometheus.py).
# Installed non-interactively when missing (as root, or through sudo), skipped when present.
TEST_DEBS ?= prometheus
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test proto venv clean test-debs

run: $(STAMP)
	$(BIN)/magic local $(RUN_ARGS)

test: $(STAMP) test-debs
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-debs:
	@missing=""; for p in $(TEST_DEBS); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages for the tests:$$missing"; \
		$(SUDO) apt-get update -qq && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

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
