# FAR's two entry points. Both set up their own environment from the pinned lock file.
#   make run    run the default FAR recipe, recipes/demo.yaml (real Gemma 3 270M, local
#               storage, Prefect ephemeral mode, CPU); RECIPE=recipes/smoke.yaml for the tiny one
#   make test   run every test, with lint and type-checks beside them (the UI test needs a
#               chromium: see browser)
#   make test-fast  the inner loop: unit tests and the integration tests not marked slow
#   make docs   the documentation site (docs/, mkdocs-material) into site/
#   make env    the .venv, plus bubblewrap and libseccomp for the reward sandbox (apt-get as root)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RECIPE ?= recipes/demo.yaml
PYTEST_ARGS ?=
# pytest-xdist workers for test and test-fast (0: one process). Each test file stays on one
# worker, the files sharing the session's flow runs on one together, the slow ones start first
# (tests/conftest.py); docs/contributing.md has the measurements behind 2.
PYTEST_WORKERS ?= 2
# The tests run JAX in pytest's own processes, so they get glibc's huge-page tunable as `far`
# gives it to itself (flows/launch.py says why; it changes no result), after any the caller set.
HUGE_PAGES := GLIBC_TUNABLES=$(if $(GLIBC_TUNABLES),$(GLIBC_TUNABLES):)glibc.malloc.hugetlb=1
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

.PHONY: run test test-fast lint lint-checks env browser build-info sandbox clean-runs docs

# uv installs the lock's wheels in parallel and byte-compiles them on every core; pip took
# 186 CPU-s on one, uv 110 on two (docs/contributing.md). Bytecode is compiled at install
# because where PYTHONDONTWRITEBYTECODE is set every process would compile its imports again.
# uv reads no pip.conf: a machine's local wheel directory (PIP_FIND_LINKS, else pip's
# configured find-links) is passed on.
FIND_LINKS = $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
UV = $(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps \
	$(if $(FIND_LINKS),--find-links $(FIND_LINKS))
$(BIN)/.installed: requirements.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "uv==0.13.8"
	$(UV) --compile-bytecode -r requirements.lock
	$(UV) -e .
	touch $@

# Rewards run model-written code and math under bubblewrap + seccomp (stages/rewards/sandbox.py).
sandbox:
	@if command -v bwrap > /dev/null && /sbin/ldconfig -p | grep -q libseccomp.so.2; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2; \
	else echo "note: no bubblewrap/libseccomp2 and not root: recipes whose rewards run model-written code are refused until 'sudo apt-get install bubblewrap libseccomp2' (or 'sandbox: {isolation: process}' accepts weaker isolation)" >&2; fi
# The commit the code came from, for records written where there is no .git (an image, a
# wheel); stages/core/runner.py reads it when `git rev-parse` cannot answer.
BUILD_INFO ?= stages/_build_info.json
build-info:
	@printf '{"git_commit": "%s"}\n' "$$(git rev-parse HEAD 2>/dev/null)" > $(BUILD_INFO)

env: $(BIN)/.installed build-info sandbox
	@echo "env: ready. To call far by name: source $(VENV)/bin/activate, then far --help"

run: env
	JAX_PLATFORMS=cpu $(BIN)/far run $(RECIPE)

lint: env
	@$(MAKE) --no-print-directory lint-checks

# lint's checks alone (no env step): what `make test` runs beside the tests
lint-checks:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy schemas stages pipeline flows
	$(BIN)/lint-imports --no-cache
	$(BIN)/deptry .
	@# the docs site, strictly (not --quiet: it hides the warnings that --strict counts)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The documentation site (mkdocs-material) into site/; the reference pages are generated from
# the code by `python -m flows.gen_docs` (a test fails when a committed one is stale).
docs: env
	$(BIN)/python -m flows.gen_docs
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	@echo "docs: open $(CURDIR)/site/index.html in a browser (search works from disk), or serve" \
		"them while editing: $(BIN)/mkdocs serve (http://127.0.0.1:8000, rebuilt on every save)"

# The Prefect UI test drives a system chromium through playwright (no browser download). With
# one on PATH nothing is installed; as root Debian's is installed; otherwise the UI test is
# skipped, and this says so.
browser:
	@if command -v chromium >/dev/null || command -v chromium-browser >/dev/null \
		|| [ -n "$$FAR_CHROMIUM" ]; then echo "chromium: found"; \
	elif [ "$$(id -u)" = 0 ]; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; \
	else echo "browser: no chromium and not root: the Prefect UI browser test will be SKIPPED" \
		"(install Debian's chromium, or set FAR_CHROMIUM to a chromium binary)"; fi

# --durations=25: the slowest tests in every run's log, so a slower suite names its cause.
# The lint checks run beside the tests, not before them: they are ~80 CPU-s, nearly all mypy on
# one core, which the tests' waits leave free (docs/contributing.md). Their output goes to
# $(LINT_LOG) and is printed after the tests'; either failing fails `make test`.
LINT_LOG := test-outputs/lint.log
test: env browser
	@mkdir -p $(dir $(LINT_LOG))
	@$(MAKE) --no-print-directory lint-checks > $(LINT_LOG) 2>&1 & lint=$$!; \
	JAX_PLATFORMS=cpu $(HUGE_PAGES) $(BIN)/pytest $(XDIST) --durations=25 $(PYTEST_ARGS); tests=$$?; \
	wait $$lint; linted=$$?; \
	echo "==== make lint-checks, run beside the tests ($(LINT_LOG)):"; cat $(LINT_LOG); \
	if [ $$linted != 0 ]; then echo "make test: lint FAILED (exit $$linted): see above" >&2; \
	exit 1; fi; exit $$tests

# Meant to take under 5 minutes on 2 idle cores: what a developer runs between edits. The
# slowest 10 are named, so a test that grew past its budget shows (mark it `slow` if it takes
# over 30 s). CI runs the full `make test`; docs/contributing.md lists the layers and the
# slowest tests.
test-fast: env
	JAX_PLATFORMS=cpu $(HUGE_PAGES) $(BIN)/pytest $(XDIST) -m "not slow" --durations=10 $(PYTEST_ARGS)

clean-runs:
	rm -rf runs
