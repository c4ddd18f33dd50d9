"""How faithfully a model continues a span it has seen: the repeat workload's premise, measured.

For snippets ``X`` of held-out code (``bench_spec.py``'s ``repeat`` workload: ``X``, the model's own greedy
continuation ``Y``, a blank line, ``X`` again), prints the median and mean length of the common prefix of the
greedy continuation after the second ``X`` with ``Y``, and the share of positions equal at the same offset, for
a few lengths of ``X`` and ``Y`` (prompt-lookup speculation is accepted about as often as the model copies).

    .venv/bin/python tools/profile/copy_probe.py [--model models/demo-target] [--prompts 24]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from tokenizers import Tokenizer

from backend.config import EngineConfig
from backend.engine.llm_engine import LLMEngine, output_token_ids
from bench.harness.workload import corpus_ids
from contracts.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = ((16, 32), (32, 48), (48, 96), (64, 64), (96, 96), (128, 96))   # (len X, len Y)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "models/demo-target"))
    ap.add_argument("--prompts", type=int, default=24)
    args = ap.parse_args(argv)
    tok = Tokenizer.from_file(str(Path(args.model) / "tokenizer.json"))
    ids, bos = corpus_ids(tok, 16384), tok.token_to_id("<|bos|>")
    blank = tok.encode("\n\n", add_special_tokens=False).ids
    engine = LLMEngine(EngineConfig(model_path=args.model, device="cpu")).start()
    try:
        for x_len, y_len in LENGTHS:
            rng = random.Random(1)
            snippets = [[bos] + ids[s:s + x_len] for s in (rng.randrange(0, len(ids) - 400) for _ in range(args.prompts))]
            greedy = SamplingParams(max_tokens=y_len, temperature=0.0, ignore_eos=True)
            ys = [output_token_ids(o) for o in engine.generate(snippets, greedy)]
            again = [output_token_ids(o) for o in engine.generate([x + y + blank + x[1:] for x, y in zip(snippets, ys)],
                                                                  greedy)]
            lcp = [common_prefix(o, y) for o, y in zip(again, ys)]
            same = statistics.mean(sum(a == b for a, b in zip(o, y)) / len(y) for o, y in zip(again, ys))
            print(f"X {x_len:3d} Y {y_len:3d} (~{2 * (x_len + y_len)} tokens): common prefix with Y median "
                  f"{statistics.median(lcp):.1f}, mean {statistics.mean(lcp):.1f} of {y_len}; same offset {same:.2f}",
                  flush=True)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
