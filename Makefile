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

# pip runs without -q: the first install downloads ~1 GB (torch, tritonserver) and takes minutes, so
# its progress bars and package names show what it is doing.
$(STAMP): requirements.txt constraints.txt pyproject.toml
	@echo "== installing into $(VENV) (first run: several minutes; later runs skip this) =="
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade pip
	@echo "== 1/3 torch ($(TORCH_SPEC)) =="
	$(PY) -m pip install $(TORCH_SPEC)
	@echo "== 2/3 requirements.txt (tritonserver via nvidia-pytriton, tritonclient, transformers, ...) =="
	$(PY) -m pip install -r requirements.txt -c constraints.txt
	@echo "== 3/3 this repository (editable) =="
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m tools.gen_proto
	touch $(STAMP)
	@echo "== installed =="

# The Python stubs of proto/ (triton_llm/v1/*_pb2*.py; committed, checked by tests/gateway/test_gateway_stubs.py).
proto: $(STAMP)
	$(PY) -m tools.gen_proto

test: install
	$(PY) -m pytest -q -p no:cacheprovider tests

serve: install
	$(PY) -m cli.serve

bench: install
	$(PY) bench/bench_engine.py

clean-venv:
	rm -rf $(VENV)
