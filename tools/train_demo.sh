#!/usr/bin/env bash
# Reproduce the committed demo models on the CPU (2 cores; about 100 minutes in all).
# 1. target and draft from scratch at the same time, one thread each;
# 2. the target continued for 600 more steps (fresh data order, lower peak LR) on both threads;
# 3. the draft distilled from the target (KL to the target's distributions, tools/distill_draft.py), one thread.
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
