"""The CLI reproduces the README's demo samples with its defaults (greedy, repetition_penalty 1.2,
64 tokens, the prompt echoed), through the whole pipeline (which speculates: greedy is lossless)."""
from __future__ import annotations

import re

import pytest

from cli import client
from cli.launcher import REPO


def readme_samples() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("Continuations of held-out function headers"):text.index("## Results")]
    return re.findall(r"```python\n(.*?)\n```", section, re.S)


SAMPLES = readme_samples()


def test_readme_has_samples():
    assert len(SAMPLES) == 3 and all(s.startswith("def ") for s in SAMPLES)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s.split("(")[0][4:] for s in SAMPLES])
def test_cli_defaults_reproduce_the_readme_sample(server, sample, capsys):
    prompt = sample.split("\n", 1)[0]
    assert client.main([prompt, "--url", server.grpc_url]) == 0
    out = capsys.readouterr()
    assert out.out == sample, f"CLI printed:\n{out.out}\n--- README says:\n{sample}"
    assert "output_tokens=64" in out.err
