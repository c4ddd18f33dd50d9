#!/usr/bin/env bash
# Reproduce the committed demo models on the CPU (2 cores; about 4 hours in all).
# 1. target and draft from scratch at the same time, one thread each;
# 2. the target continued for 600 more steps (fresh data order, lower peak LR) on both threads;
# 3. the draft distilled from the target (KL to the target's distributions, tools/distill_draft.py), one thread;
# 4. the target continued at 512 tokens, half its rows repeating one of their own spans, so that it continues
#    a span it has seen as real LLMs do (prompt-lookup speculation relies on it; held-out copy accuracy 43% -> 66%),
#    and the draft distilled again from it;
# 5. the demo LoRA adapter on the torch package's source (tools/train_lora.py, docs/lora.md), one thread.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
$PY -m tools.train_tokenizer --out runs/tok --vocab-size 4096
$PY -m tools.train_model --size draft --tokenizer runs/tok --out models/demo-draft --steps 600 --seed 0 --threads 1 &
$PY -m tools.train_model --size target --tokenizer runs/tok --out runs/target-stage1 --steps 700 --seed 0 --threads 1
wait
$PY -m tools.train_model --size target --tokenizer runs/tok --init-from runs/target-stage1 --out models/demo-target \
    --steps 600 --lr 1e-3 --warmup 20 --seed 1 --threads 2
$PY -m tools.distill_draft --target models/demo-target --init models/demo-draft --out runs/draft-distilled \
    --steps 422 --threads 1   # the committed run used --minutes 36 (a cosine over wall time) and reached 422 steps
cp runs/draft-distilled/* models/demo-draft/
$PY -m tools.distill_draft --target models/demo-target --init models/demo-draft --out runs/draft-distilled2 \
    --steps 1172 --lr 1.2e-3 --seed 3 --threads 1   # committed: --minutes 55, 1172 steps
cp runs/draft-distilled2/* models/demo-draft/
$PY -m tools.train_model --size target --tokenizer runs/tok --init-from models/demo-target --out runs/target-copy \
    --steps 400 --seq-len 512 --batch 16 --copy-fraction 0.5 --lr 1e-3 --warmup 20 --seed 4 --threads 2
$PY -m tools.train_model --size target --tokenizer runs/tok --init-from runs/target-copy --out runs/target-copy2 \
    --steps 600 --seq-len 512 --batch 16 --copy-fraction 0.5 --lr 1e-3 --warmup 20 --seed 5 --threads 2
cp runs/target-copy2/* models/demo-target/
$PY -m tools.distill_draft --target models/demo-target --init models/demo-draft --out runs/draft-copy \
    --minutes 28 --lr 1.2e-3 --seed 6 --threads 1   # committed: 832 steps
$PY -m tools.distill_draft --target models/demo-target --init runs/draft-copy --out runs/draft-copy2 \
    --minutes 30 --lr 1.2e-3 --seed 7 --threads 2   # committed: 1582 steps
cp runs/draft-copy2/* models/demo-draft/
$PY -m tools.train_lora --base models/demo-target --out models/demo-lora/torch-style --steps 172 --threads 1 \
    --seed 0   # committed: --minutes 7, 172 steps
