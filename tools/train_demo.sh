#!/usr/bin/env bash
# Reproduce the committed demo models (about 75 minutes on 2 CPU cores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
$PY -m tools.train_tokenizer --out runs/tok --vocab-size 4096
$PY -m tools.train_model --size target --tokenizer runs/tok --out models/demo-target --steps 900 --seed 0 --threads 1
$PY -m tools.train_model --size draft --tokenizer runs/tok --out models/demo-draft --steps 800 --seed 0 --threads 1
