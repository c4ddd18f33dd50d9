# One-command setup: `make test` and `make serve` create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NATIVE_STAMP := $(VENV)/.native-built
# On a GPU machine: make install TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
TORCH_SPEC ?= torch==2.13.0

.PHONY: install helm test serve bench clean-venv proto

install: $(STAMP) $(NATIVE_STAMP)

# The native CPU kernels (about 2 minutes on 2 cores), built here so the first start does not wait for
# them; the build is cached by source hash, so this reruns only when csrc/ changes.
$(NATIVE_STAMP): $(STAMP) $(wildcard backend/native/csrc/*) backend/native/build.py
	@echo "== native kernels (backend/native/csrc: about 2 minutes on 2 cores, once) =="
	$(PY) -m backend.native.build
	touch $(NATIVE_STAMP)

# helm for the chart tests only: PATH, else .cache/helm/helm (idempotent).
helm: $(STAMP)
	$(PY) -m tools.fetch_helm

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

# One pytest worker per core (TEST_WORKERS=1: serially); the tests of one session server share a worker
# (xdist_group marks in tests/e2e and tests/faults).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)

test: install helm
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup tests

serve: install
	$(PY) -m cli.serve

bench: install
	$(PY) -m bench.bench_engine

clean-venv:
	rm -rf $(VENV)
