#!/usr/bin/env bash
# Every GPU check of the project in one script, for a CUDA machine lent for a few minutes (docs/gpu.md):
#   1. python -m tools.gpu_decode: captured vs eager decode step, batch-1 tok/s of a 1B-class bf16 Llama against the
#      HBM roofline, the paged decode kernel's bandwidth at an 8k context, the Triton int8/int4 GEMV;
#   2. the tests that need CUDA (compiled Triton kernels, CUDA graphs);
#   3. the oracle suites (engine, speculation, guided decoding, quantized KV) with every engine on CUDA in fp32
#      (tests/helpers/on_device.py), eager, then again with the captured step (tests/helpers/force_fast_decode.py).
# Each stage has its own time limit; a failing stage does not stop the next. Logs and the bench's JSON go to
# $OUT (or /tmp/gpu_check). Packages the machine lacks (xgrammar and its needs) may be carried as wheels in
# .whl/ (git-ignored), installed under /tmp/site.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
PY=${PY:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

stage() {   # stage NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, print its tail and status
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0)) s"
  tail -n "${TAIL:-25}" "$OUT/$name.log"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  $PY -c "import torch, triton, transformers, tokenizers, sys; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  $PY -c "import importlib.metadata as m, xgrammar; print('xgrammar', m.version('xgrammar'))" 2>&1 | tail -1
} 2>&1

# Stages, most telling first; STAGES picks some (e.g. STAGES="oracle_cuda cuda_tests"). Sequential: the first H200
# run found three pytest-xdist stages side by side too slow (nine workers of 16 threads each on 16 cores) to
# finish in 170 s. About 40 s for the bench; a test stage is bounded by its limit.
STAGES=${STAGES:-"bench oracle_cuda oracle_cuda_graphs cuda_tests guided_cuda kernels"}
PYTEST="$PY -m pytest -q -p no:cacheprovider -o addopts= --timeout ${TEST_TIMEOUT_S:-90} -rfE"
ORACLES="tests/backend/engine/test_engine_oracle.py tests/backend/spec_decode/test_spec_oracle.py
  tests/backend/engine/test_engine_kv_quant.py"
GUIDED="tests/backend/engine/test_engine_guided.py tests/backend/spec_decode/test_guided_speculation.py"
for s in $STAGES; do
  case $s in
    bench) TAIL=80 stage bench "${BENCH_S:-90}" $PY -m tools.gpu_decode
           cp bench/results/gpu_decode.json "$OUT/" 2>/dev/null ;;
    oracle_cuda) stage oracle_cuda "${TESTS_S:-150}" $PYTEST -p tests.helpers.on_device $ORACLES ;;
    oracle_cuda_graphs) stage oracle_cuda_graphs "${TESTS_S:-150}" $PYTEST -p tests.helpers.on_device \
                          -p tests.helpers.force_fast_decode $ORACLES ;;
    cuda_tests) stage cuda_tests "${TESTS_S:-150}" $PYTEST tests/backend/engine/test_cuda_graph_decode.py \
                  tests/backend/attention/test_kv_quant.py tests/backend/model/test_quant_triton.py \
                  tests/backend/sampling/test_bitmask_kernels.py -k "not compiled_kernels" ;;
    guided_cuda) stage guided_cuda "${TESTS_S:-150}" $PYTEST -p tests.helpers.on_device $GUIDED ;;
    kernels) stage kernels "${KERNELS_S:-240}" bash -c "$PY tests/backend/attention/gpu_attention_check.py &&
               $PY tests/backend/attention/gpu_kv_quant_check.py" ;;
    *) echo "unknown stage $s" ;;
  esac
done
