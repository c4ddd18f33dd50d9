# One-command setup: `make test` and `make serve` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# On a GPU machine: make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0

.PHONY: install test test-fast serve client bench clean-venv proto

install: $(STAMP)
	$(PY) tools/fetch_helm.py  # helm for the chart tests: PATH, else .cache/helm/helm (idempotent)

$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -r requirements.txt -c constraints.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m tools.gen_proto
	touch $(STAMP)

# The Python stubs of proto/ (triton_llm/v1/*_pb2*.py; committed, checked by tests/gateway/test_gateway_stubs.py).
proto: $(STAMP)
	$(PY) -m tools.gen_proto

test: install
	$(PY) -m pytest -q -p no:cacheprovider tests

serve: install
	$(PY) -m tools.serve

bench: install
	$(PY) bench/bench_engine.py

clean-venv:
	rm -rf $(VENV)
