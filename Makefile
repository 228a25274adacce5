# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
# Installed before the project so that pip does not pick a torch for us: on a machine that keeps a
# CPU build on disk this takes it; elsewhere it is PyPI's default (CUDA) build. Override at will:
#   make demo TORCH_SPEC="torch==2.5.1"
TORCH_SPEC ?= torch==2.13.0
# The dashboard's browser test drives Debian's chromium through Playwright (never a downloaded browser).
CHROMIUM ?= /usr/bin/chromium
# Test processes for `make test` (pytest-xdist); 0 runs the suite in this one process. More processes
# than cores: most end-to-end tests wait on servers, workers and their intervals, not on the CPU; each
# process uses one torch thread (tests/conftest.py). worksteal: an idle process takes queued tests
# from a busy one, so one process is not left with the long tests while the others wait.
TEST_WORKERS ?= 4
PYTEST_DIST := -n $(TEST_WORKERS) --dist worksteal
# The project's importable sources (make bytecode compiles them).
SOURCES := gluejobs gluejobs_server service shared worker alembic tests bench
COMPILE_SOURCES = $(BIN)/python -m compileall -q -j 0 $(SOURCES)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: install install-test demo stop test test-fast bytecode lint docs bench dist install-figures clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Both distributions of this repository, editable: gluejobs (the client and CLI, ./pyproject.toml) and
# gluejobs-server (the API, workers and migrations, server/pyproject.toml); docs/operators/install.md.
$(VENV)/.installed: $(BIN)/python pyproject.toml server/pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet -e . -e "./server[demo]"
	touch $@

# The test environment in one pip run (torch pinned in the same resolution), without compiling
# bytecode: pip compiles all of it, one file after another (about 22,000 files, 63 CPU-seconds on
# the 2-core machine), where the suite imports about 2,000; the suite writes the caches of what it
# imports as it goes (`make test`, `make test-fast`: PYTHONDONTWRITEBYTECODE is cleared for them).
# It installs everything `make install` does, so it stamps that too.
$(VENV)/.installed-test: $(BIN)/python pyproject.toml server/pyproject.toml
	$(BIN)/pip install --quiet --no-compile "$(TORCH_SPEC)" -e ".[test,docs]" -e "./server[demo,mlflow,s3-test]"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium

## make demo: migrate a SQLite database under ./var, start the API and a worker, fine-tune MiniLM on a
## small sentiment dataset and print its metrics as they arrive; the API stays up (make stop ends it).
demo: install
	$(BIN)/gluejobs migrate
	$(BIN)/gluejobs demo

stop:
	$(BIN)/gluejobs demo --stop

## make test: ruff, mypy and the whole suite (SQLite and the Postgres at 127.0.0.1:5432); installs
## chromium (Debian's package) for the dashboard's browser test when it is missing. The docs site is
## built too (tests/project/test_docs.py: mkdocs build --strict) and every page's commands run
## (test_readme_commands). CI runs this.
## The steps that do not need each other run two at a time: pip beside apt's chromium (a download,
## then dpkg), mypy beside the bytecode (mypy leaves the second core idle).
test:
	$(MAKE) --no-print-directory -j2 install-test $(CHROMIUM)
	$(MAKE) --no-print-directory -j2 lint bytecode
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest $(PYTEST_DIST) --durations=25

## make test-fast: the quick loop, SQLite only: no Postgres, nothing that starts servers or workers
## (e2e) and no slow training (a few minutes; `make test` before a merge).
test-fast: install-test
	$(COMPILE_SOURCES)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest $(PYTEST_DIST) -m "not slow and not e2e and not postgres"

## make bytecode: the project's modules compiled, and the test modules as pytest rewrites their asserts
## (with the libraries collection imports: torch, transformers ...), once, before the suite. The suite
## starts hundreds of interpreters (APIs, workers, warm-start templates, jobs, commands), and each of
## its four test processes collects every test module: with nothing cached, each of them compiled the
## same sources again (a test process 8-10 CPU-seconds of its collection, an API start 0.35). Where
## PYTHONDONTWRITEBYTECODE is set (it is on the CI machine) this clears it, as `make test` does for the
## suite: the caches land in this tree and in .venv. `make test` runs this beside mypy, which leaves
## the second core idle.
bytecode: install-test
	$(COMPILE_SOURCES)
	PYTHONDONTWRITEBYTECODE= $(BIN)/pytest --collect-only -q -p no:cacheprovider > /dev/null || true

## make lint: ruff (lint and format) and mypy, in two processes (mypy's --num-workers: a cold check
## of the project took 58 s in one and 41 s in two on the 2-core machine).
MYPY_WORKERS ?= 2
lint: install-test
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --num-workers $(MYPY_WORKERS)

## make docs: the documentation site (mkdocs.yml, docs/) into site/, every warning an error.
docs: install-test
	$(BIN)/mkdocs build --strict

## make bench: the SST-2 benchmark through the real API and worker (prints one JSON line).
bench: install-test
	$(BIN)/python bench/sst2_bench.py

## make dist: the two wheels a release ships, in dist/: gluejobs and gluejobs-server. Nothing of the
## development environment: a venv with pip alone (under build/), whose `pip wheel` builds each
## distribution in an isolated environment with hatchling from the package index.
DIST_DIR ?= dist
DIST_VENV ?= build/dist-venv

$(DIST_VENV)/bin/pip:
	$(PYTHON) -m venv $(DIST_VENV)

dist: $(DIST_VENV)/bin/pip
	$(DIST_VENV)/bin/pip wheel --quiet --no-deps --wheel-dir $(DIST_DIR) . ./server

## make install-figures: tests/project/test_install.py with every role's line as docs/operators/install.md
## writes it (the CPU worker's too: about five more minutes), writing the measured sizes and times into
## that page's table.
install-figures: install-test
	GLUEJOBS_INSTALL_FIGURES=write GLUEJOBS_INSTALL_TEST_FRESH_WORKER=1 $(BIN)/pytest -q tests/project/test_install.py

clean:
	rm -rf var site .pytest_cache .mypy_cache .ruff_cache
	find $(SOURCES) -name __pycache__ -type d -prune -exec rm -rf {} +
