#!/usr/bin/env bash
# Benchmark a running server (make serve) with NVIDIA genai-perf, from its own venv under .cache/
# (genai-perf pins tritonclient 2.51 / protobuf 4, which must not enter the project's .venv).
#
#   tools/genai_perf.sh                          # defaults below
#   tools/genai_perf.sh --concurrency 16         # extra arguments go to `genai-perf profile`
#
#   API=openai tools/genai_perf.sh               # the OpenAI API on OPENAI_PORT (chat, streamed)
#
# Env: API (triton or openai), GRPC_PORT (8001), OPENAI_PORT (9000), MODEL (demo-target, the served model's
# name on the OpenAI API), TOKENIZER (models/demo-target).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.cache/genai-perf-venv
LIBS=.cache/pa-libs
PYLIBS=.venv/lib/python3.11/site-packages/nvidia_pytriton.libs

if [ ! -x "$VENV/bin/genai-perf" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "tritonclient[all]==2.51.0" genai-perf
fi
# perf_analyzer (from the tritonclient wheel) links libb64.so.0d and libcudart.so.12; nvidia-pytriton
# bundles both under hashed names.
mkdir -p "$LIBS"
ln -sf "$PWD/$(ls $PYLIBS/libb64-*.so.0d | head -n1)" "$LIBS/libb64.so.0d"
ln -sf "$PWD/$(ls $PYLIBS/libcudart-*.so.12* | head -n1)" "$LIBS/libcudart.so.12"
export LD_LIBRARY_PATH="$PWD/$LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$PWD/$VENV/bin:$PATH"

common=(--tokenizer "${TOKENIZER:-models/demo-target}" --streaming
        --synthetic-input-tokens-mean 64 --synthetic-input-tokens-stddev 0 --output-tokens-mean 64
        --num-prompts 50 --request-count 50 --concurrency 8 --extra-inputs temperature:0.0)
case ${API:-triton} in
  triton) exec genai-perf profile -m ensemble --endpoint-type kserve --backend tensorrtllm \
            -u "localhost:${GRPC_PORT:-8001}" --artifact-dir .cache/genai-perf \
            --extra-inputs exclude_input_in_output:true "${common[@]}" "$@" ;;
  openai) exec genai-perf profile -m "${MODEL:-demo-target}" --endpoint-type chat \
            -u "localhost:${OPENAI_PORT:-9000}" --artifact-dir .cache/genai-perf-openai "${common[@]}" "$@" ;;
  *) echo "API must be triton or openai, got '${API}'" >&2; exit 2 ;;
esac
