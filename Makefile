# The two set-up commands: `make demo` and `make test`. Each creates .venv if missing
# and installs what it needs; nothing else is required on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: demo test test-slow lint typecheck unit clean postgres-server browser

$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip setuptools wheel
	touch $@

# torch==2.13.0 is the local CPU wheel; installing it first keeps the `torch>=2.2` extra
# from pulling a CUDA build.
$(VENV)/.demo: $(VENV)/.base pyproject.toml
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[torch,plot,cli,federated]'
	touch $@

$(VENV)/.dev: $(VENV)/.demo pyproject.toml
	$(PIP) install -e '.[dev,torch,plot,cli,federated,flower,hf]'
	touch $@

demo: $(VENV)/.demo
	MPLBACKEND=Agg $(PY) -m renyi.demo

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(VENV)/.dev
	$(VENV)/bin/mypy

# The ledger tests start a real PostgreSQL server of their own (initdb + pg_ctl into a temp
# dir, unix socket only); install the server binaries when missing (CI runs as root).
postgres-server:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql)

# The dashboard's browser test drives Debian's headless Chromium through its chromedriver
# (Selenium with the system driver: no browser download); install both when missing.
browser:
	@(command -v chromium && command -v chromedriver) >/dev/null 2>&1 || \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver)

# tests/ plus every docstring example in src/renyi and every >>> example in docs/*.md.
# Tests marked `slow` (extra high-precision reference grids, minutes each) run with
# `make test-slow`; the required grids are in the default suite.
# pytest-xdist spreads the suite over the machine's 2 cores (-n 2); statistical tests are
# written to hold at load average 20, so a neighbouring worker does not disturb them.
unit: $(VENV)/.dev postgres-server browser
	MPLBACKEND=Agg $(PY) -m pytest -q -n 2 --durations=25 -m "not slow" tests
	MPLBACKEND=Agg $(PY) -m pytest -q --doctest-modules --doctest-glob='*.md' src/renyi docs

test: lint typecheck unit

test-slow: $(VENV)/.dev postgres-server browser
	MPLBACKEND=Agg $(PY) -m pytest -q -n 2 -m slow tests

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
