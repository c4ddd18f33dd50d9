#!/usr/bin/env bash
# Reproduce the committed demo models on the CPU: target and draft train at the same time,
# one thread each (about 50 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
$PY -m tools.train_tokenizer --out runs/tok --vocab-size 4096
$PY -m tools.train_model --size draft --tokenizer runs/tok --out models/demo-draft --steps 600 --seed 0 --threads 1 &
$PY -m tools.train_model --size target --tokenizer runs/tok --out models/demo-target --steps 700 --seed 0 --threads 1
wait
