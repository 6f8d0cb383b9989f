# FAR's two entry points. Both set up their own environment from the pinned lock file.
#   make run    run the default FAR recipe, recipes/demo.yaml (real Gemma 3 270M, local
#               storage, Prefect ephemeral mode, CPU); RECIPE=recipes/smoke.yaml for the tiny one
#   make test   lint, type-check and run every test (installs Debian chromium for the UI test)
#   make env    the .venv, plus bubblewrap and libseccomp for the reward sandbox (apt-get as root)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RECIPE ?= recipes/demo.yaml
PYTEST_ARGS ?=

.PHONY: run test lint env browser sandbox clean-runs

$(BIN)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade "pip==26.3"
	$(BIN)/pip install --quiet --no-deps -r requirements.lock
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

env: $(BIN)/.installed sandbox

# Rewards run model-written code and math under bubblewrap + seccomp (stages/rewards/sandbox.py).
sandbox:
	@if command -v bwrap > /dev/null && /sbin/ldconfig -p | grep -q libseccomp.so.2; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2; \
	else echo "note: no bubblewrap/libseccomp2 and not root: recipes whose rewards run model-written code are refused until 'sudo apt-get install bubblewrap libseccomp2' (or 'sandbox: {isolation: process}' accepts weaker isolation)" >&2; fi

run: env
	JAX_PLATFORMS=cpu $(BIN)/far run $(RECIPE)

lint: env
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy schemas stages pipeline
	$(BIN)/lint-imports --no-cache

# The Prefect UI test drives the system's chromium through playwright (no browser download).
browser:
	@if [ -x /usr/bin/chromium ]; then echo "chromium: /usr/bin/chromium"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; fi

test: lint browser
	JAX_PLATFORMS=cpu $(BIN)/pytest $(PYTEST_ARGS)

clean-runs:
	rm -rf runs
