# The two set-up commands of the README: `make run` and `make test`. Each creates .venv when it is
# missing, installs the pinned set (constraints.txt) and fetches the Harmony vocab if needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: install run test lint check vocab tools deploy-check bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

vocab: install
	$(PY) -m proxy vocab

run: vocab
	$(PY) -m proxy serve $(ARGS)

# Debian's packages for the end-to-end tests: Prometheus (the metrics test) and redis-server (the
# store's Redis backend, started by the tests on a free loopback port). kubectl is expected on PATH.
tools:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null \
	  && command -v redis-server >/dev/null || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus redis-server; }

# The suite runs in parallel, one process per core (pytest-xdist; TEST_JOBS=0 runs it in this
# process). A test file stays on one worker (--dist loadfile), so a module's servers start once.
# pytest-cov measures each worker with [tool.coverage.*] (branch coverage of proxy/) and
# combines their data into .coverage, which `coverage report` prints.
TEST_JOBS ?= auto
test: vocab tools
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile --cov --cov-report= $(PYTEST_ARGS)
	$(PY) -m coverage report

# The layers of proxy/ (pyproject.toml's [tool.importlinter]) and no import circle anywhere.
lint: install
	$(PY) -m ruff format --check proxy tests bench
	$(PY) -m ruff check proxy tests bench
	$(PY) -m mypy --strict proxy
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(PY) -m pytest -q -p no:cacheprovider tests/test_import_graph.py

deploy-check: install tools
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" scripts/check-deploy

check: lint test deploy-check

clean:
	rm -rf $(VENV) .coverage .mypy_cache .ruff_cache .pytest_cache .hypothesis
