"""The distillation objective and the agreement measure of tools/distill_draft.py."""
from __future__ import annotations

import pytest
import torch

from tools.distill_draft import distillation_loss, greedy_agreement


def test_kl_is_zero_only_when_the_draft_matches_the_target():
    teacher = torch.randn(8, 16)
    assert distillation_loss(teacher.clone(), teacher, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    assert distillation_loss(teacher + 1.0, teacher, 1.0).item() == pytest.approx(0.0, abs=1e-6)   # shift-invariant
    assert distillation_loss(torch.randn(8, 16), teacher, 1.0).item() > 0.01


def test_kl_gradient_moves_the_draft_towards_the_target():
    teacher = torch.randn(4, 10)
    student = torch.zeros(4, 10, requires_grad=True)
    before = distillation_loss(student, teacher, 2.0)
    before.backward()
    with torch.no_grad():
        after = distillation_loss(student - 0.5 * student.grad, teacher, 2.0)
    assert after.item() < before.item()


def test_greedy_agreement_counts_equal_argmaxes():
    student = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 2.0], [3.0, 0.0]])
    assert greedy_agreement(student, torch.tensor([1, 0, 0, 1])) == 0.5


def test_distillation_note_names_every_run_and_its_agreement():
    from tools.model_report import distillation_note

    run = {"kind": "distill", "steps": 10, "tokens_seen": 2e6, "training_minutes": 3.0, "peak_lr": 1e-3,
           "temperature": 1.0, "heldout_agreement_before": 0.5, "heldout_agreement_after": 0.55}
    later = dict(run, heldout_agreement_before=0.55, heldout_agreement_after=0.61)
    text = "\n".join(distillation_note({"runs": [{"steps": 5}, run, later]}))
    assert text.startswith("The draft was then distilled from the target")
    assert "Distillation run 2 continued from that draft" in text
    assert "50.0% before, 55.0% after" in text and "55.0% before, 61.0% after" in text
    assert distillation_note({"runs": [{"steps": 5}]}) == []


@pytest.mark.parametrize("args", [["--copy-fraction", "1.5"], ["--copy-fraction", "0.5", "--copy-span", "1,8"],
                                  ["--copy-span", "64,8"]])
def test_copy_options_are_checked_before_anything_loads(monkeypatch, tmp_path, args):
    import sys

    from tools import distill_draft

    monkeypatch.setattr(sys, "argv", ["distill_draft", "--out", str(tmp_path), "--steps", "1", *args])
    with pytest.raises(ValueError, match="--copy"):
        distill_draft.main()
