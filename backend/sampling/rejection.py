"""Speculative verification's rules, as pure functions (terms: backend/core/plan.py).

*Coupled* verification (``coupled_verify``): every verified row draws its token with the keyed draw of its
position (``keyed_draw.py``); draft ``d_{j+1}`` is accepted iff it equals the draw at row ``j``, and the first
draw that differs, or the bonus row's draw, is emitted. For a deterministic draft this accepts with probability
``p_j(d)``, as the standard rule does, and the tokens are those of steps without drafts; a greedy target's draw
is its argmax. The engine verifies n-gram drafts and Gumbel-coupled draft-model drafts this way.

*Standard rejection sampling*, for drafts drawn from a distribution ``q``: for a sequence with drafts ``d_1..d_k`` (``d_j`` drawn from ``q_j``; a point mass for n-gram drafts
and for greedy ones) and the target's distributions ``p_0..p_k`` (``p_j`` at the position after
``d_j``, computed with every sampling filter exactly as plain sampling would), draft ``d_{j+1}`` is
*accepted* with probability ``min(1, p_j(d) / q_j(d))``, left to right until one is rejected. At the
first rejection the *recovered* token is drawn from ``norm(max(0, p_j - q_j))``; when all ``k`` are
accepted the *bonus* token is drawn from ``p_k``. The output then has exactly the target's
distribution (Leviathan et al. 2023, Chen et al. 2023). Greedy rows have a one-hot ``p``: a draft is
accepted iff it is the argmax, and the recovered token is the argmax.
"""
from __future__ import annotations

import numpy as np
import torch


def acceptance_probs(
    draft_ids: torch.Tensor,           # [B, K] int64 (padding past num_drafts is ignored)
    target_probs: torch.Tensor,        # [B, K + 1, vocab] fp32
    draft_probs: torch.Tensor | None,  # [B, K, vocab] fp32; None: every draft is a point mass (q(d) = 1)
) -> torch.Tensor:                     # [B, K] fp32: min(1, p_j(d_{j+1}) / q_j(d_{j+1}))
    p = target_probs[:, :-1].gather(2, draft_ids[:, :, None]).squeeze(2)
    if draft_probs is None:
        return p.clamp(max=1.0)
    q = draft_probs.gather(2, draft_ids[:, :, None]).squeeze(2)
    return torch.where(q > 0, (p / q.clamp(min=1e-30)).clamp(max=1.0), torch.zeros_like(p))


def num_accepted(
    accept_probs: torch.Tensor,  # [B, K] fp32
    uniforms: torch.Tensor,      # [B, K] fp32 in [0, 1)
    num_drafts: torch.Tensor,    # [B] int64
) -> torch.Tensor:               # [B] int64: leading drafts accepted, <= num_drafts
    k = accept_probs.shape[1]
    valid = torch.arange(k, device=accept_probs.device)[None, :] < num_drafts[:, None]
    accepted = (uniforms < accept_probs) & valid
    return accepted.long().cumprod(dim=1).sum(dim=1)


def recovery_probs(
    num_accepted: torch.Tensor,        # [B] int64
    num_drafts: torch.Tensor,          # [B] int64
    draft_ids: torch.Tensor,           # [B, K] int64
    target_probs: torch.Tensor,        # [B, K + 1, vocab] fp32
    draft_probs: torch.Tensor | None,  # [B, K, vocab] fp32 or None (point masses)
) -> torch.Tensor:                     # [B, vocab] fp32, unnormalised: what the last token is drawn from
    """``max(0, p_j - q_j)`` at the first rejected position ``j``, or ``p_k`` (bonus) when none was."""
    rows = torch.arange(num_accepted.shape[0], device=num_accepted.device)
    p = target_probs[rows, num_accepted]                                       # [B, vocab]
    rejected = num_accepted < num_drafts                                       # [B]
    if not bool(rejected.any()):
        return p
    j = num_accepted.clamp(max=max(draft_ids.shape[1] - 1, 0))
    if draft_probs is None:
        q = torch.zeros_like(p).scatter_(1, draft_ids[rows, j][:, None], 1.0)
    else:
        q = draft_probs[rows, j]
    residual = (p - q).clamp_(min=0.0)
    # a residual that is all zero (p == q up to rounding) cannot happen for a rejected draft in exact
    # arithmetic; fall back to p rather than draw from nothing
    residual = torch.where(residual.sum(dim=1, keepdim=True) > 0, residual, p)
    return torch.where(rejected[:, None], residual, p)


def host_rejection_rule(
    probs: np.ndarray,          # [num_rows, vocab] float32: p of every verified position, rows of seq i then seq i+1
    row_starts: list[int],      # [B] first row of each sequence
    drafts: list[list[int]],    # [B] each sequence's k_i drafts
    uniforms: np.ndarray,       # [B, max k] float32 in [0, 1): draft j is accepted when u_j < its acceptance prob.
    draft_probs: list[np.ndarray | None] | None = None,   # [B] each [k_i, vocab] float32 q; None: point masses
) -> tuple[list[int], np.ndarray]:   # (accepted drafts per sequence, [B, vocab] float32 to draw the last token from)
    """``num_accepted(acceptance_probs(...))`` and ``recovery_probs`` on the host, one sequence at a time, bit for bit
    the same values (float32 scalar and row arithmetic, as the tensor ops do it; a point mass's ``max(0, p - q)`` is
    ``p`` with the draft zeroed) without the dozen tensor ops that cost a CPU verify step ~250 us whatever its
    size. A draft is looked at only until the first rejection, so most rows are never touched."""
    accepted, last = [], np.empty((len(drafts), probs.shape[1]), dtype=np.float32)
    tiny = np.float32(1e-30)
    for i, (start, d) in enumerate(zip(row_starts, drafts)):
        q = draft_probs[i] if draft_probs is not None else None
        a = 0
        while a < len(d):
            p_d = probs[start + a, d[a]]
            if q is None:
                ok = uniforms[i, a] < min(1.0, p_d)
            else:
                q_d = q[a, d[a]]
                ok = q_d > 0 and uniforms[i, a] < min(1.0, p_d / max(q_d, tiny))
            if not ok:
                break
            a += 1
        accepted.append(a)
        p = probs[start + a]
        if a == len(d):                    # bonus: p itself
            last[i] = p
        elif q is None:                    # recovered from p less the rejected point mass
            last[i] = p
            last[i, d[a]] = 0.0
        else:                              # recovered from max(0, p - q)
            np.maximum(p - q[a], 0.0, out=last[i])
        if a < len(d) and not last[i].any():   # an all-zero residual (p == q up to rounding): p itself
            last[i] = p
    return accepted, last


def coupled_verify(draws: list[int],          # the token drawn at every row: a sequence's k + 1 rows, then the next's
                   drafts: list[list[int]],   # per sequence, its k drafts
                   ) -> list[list[int]]:
    """Per sequence, the drafts that equal the draw at the row before them, then the draw after the last accepted
    one (the recovered token, or the bonus one when every draft was accepted)."""
    out, row = [], 0
    for d in drafts:
        a = 0
        while a < len(d) and d[a] == draws[row + a]:
            a += 1
        out.append(d[:a] + [draws[row + a]])
        row += len(d) + 1
    return out
