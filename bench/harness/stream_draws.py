"""The stream draw, a baseline for the keyed one: what each sampled row costs when its uniform is the next number of
its sequence's own ``torch.Generator`` (seeded ``seed + sequence index``) and the inverse-CDF search runs per row on
the host, as a sampler whose draws depend on how many numbers were drawn before does it.

``bench_spec``'s ``none-stream-draw`` method puts it in an engine's sampler in place of ``DrawKernels``, so sampled
TPOT with keyed draws is measured against it in the same run (docs/benchmarks.md). Its tokens follow the same law,
not the same keys: a baseline for speed, not for replay.
"""
from __future__ import annotations

import numpy as np
import torch

from backend.sampling.keyed_draw import DrawKeys, DrawRule
from backend.sampling.keyed_noise import NoiseStream


class StreamDraws:
    """``DrawKernels.draw`` / ``uniforms`` from per-sequence generator streams (the inverse-CDF rule only)."""

    def __init__(self):
        self._streams: dict[tuple[int, int], torch.Generator] = {}

    def _generator(self, seed: int, seq_index: int) -> torch.Generator:
        g = self._streams.get((seed, seq_index))
        if g is None:
            g = self._streams[(seed, seq_index)] = torch.Generator().manual_seed((seed + seq_index) % 2**64)
        return g

    def uniforms(self, keys: DrawKeys, stream: NoiseStream, device="cpu") -> torch.Tensor:   # -> [n] float64
        u = torch.empty(len(keys), dtype=torch.float64)
        for i, (s, j) in enumerate(zip(keys.seeds, keys.seq_indices)):
            u[i] = torch.rand(1, dtype=torch.float64, generator=self._generator(s, j))
        return u

    def draw(self, probs: torch.Tensor,   # [n, vocab] on the CPU
             keys: DrawKeys, rule: DrawRule, stream: NoiseStream = NoiseStream.DRAW) -> torch.Tensor:   # [n] int64
        if rule is not DrawRule.INVERSE_CDF:
            raise ValueError("StreamDraws: the inverse-CDF rule only")
        us = self.uniforms(keys, stream).numpy()
        cdf = probs.cumsum(dim=-1, dtype=torch.float64).numpy()
        p, last = probs.numpy(), probs.shape[-1] - 1
        out = np.empty(len(us), dtype=np.int64)
        for i, u in enumerate(us):
            t = min(int(np.searchsorted(cdf[i], u * cdf[i, -1], side="right")), last)
            out[i] = t if p[i, t] > 0 else int(p[i].argmax())
        return torch.from_numpy(out)
