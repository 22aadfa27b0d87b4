# The two set-up commands of the README: `make run` and `make test`. Each creates .venv when it is
# missing, installs the pinned set (constraints.txt) and fetches the Harmony vocab if needed.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_INSTALL := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt

.PHONY: install run test lint check vocab bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e '.[dev]'
	touch $@

install: $(VENV)/.installed

vocab: install
	$(PY) -m proxy vocab

run: vocab
	$(PY) -m proxy serve $(ARGS)

test: vocab
	$(PY) -m coverage run -m pytest $(PYTEST_ARGS)
	$(PY) -m coverage report

lint: install
	$(PY) -m ruff format --check proxy tests bench
	$(PY) -m ruff check proxy tests bench
	$(PY) -m mypy --strict proxy

check: lint test

clean:
	rm -rf $(VENV) .coverage .mypy_cache .ruff_cache .pytest_cache .hypothesis
