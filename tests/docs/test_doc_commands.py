"""Every ``cli.client`` and ``cli.serve`` command in a ``bash`` block of the README and docs/ parses as pasted: the
flags exist, take the values shown, and nothing is left over (a placeholder such as ``[--lora NAME]`` would fail
with "unrecognized arguments"). Environment prefixes (``TRITON_LLM_SET=... make serve``) are checked for the
variables ``make serve`` reads, and give its five servers a port each."""
from __future__ import annotations

import re
import shlex

import pytest

from cli import client, serve
from cli.launcher import Ports
from cli.serve_ports import check_distinct, gateway_listen_from_env
from tests.helpers.api_docs import REPO

DOCS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])
PARSERS = {"cli.client": client.parse_args, "llm-client": client.parse_args, "cli.serve": serve.parse_args}
ENDS = {"|", "||", "&&", ";", "&", ">", ">>", "2>&1"}


def commands(text: str) -> list[str]:
    """The command lines of the ``bash`` blocks, continuation lines joined."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        out += [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    return out


def invocation(line: str) -> tuple[str, list[str]] | None:
    """(module, its arguments up to the end of the command) for a line that runs one of ``PARSERS``."""
    if not any(name in line for name in PARSERS):
        return None
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:      # bash's $'...' quoting or a heredoc: shlex cannot read it
        tokens = shlex.split(re.sub(r"\$'(?:[^'\\]|\\.)*'", "PROMPT", line), comments=True)
    for i, token in enumerate(tokens):
        name = token.rsplit("/", 1)[-1]
        if name in PARSERS or (token == "-m" and i + 1 < len(tokens) and tokens[i + 1] in PARSERS):
            start = i + 1 if name in PARSERS else i + 2
            args = []
            for arg in tokens[start:]:
                if arg in ENDS or arg.startswith((">", "2>")):
                    break
                args.append(arg)
            return (name if name in PARSERS else tokens[i + 1]), args
    return None


DOCUMENTED = [(path.relative_to(REPO).as_posix(), line, call) for path in DOCS
              for line in commands(path.read_text()) if (call := invocation(line)) is not None]


def test_the_docs_show_commands():
    modules = {call[0] for _, _, call in DOCUMENTED}
    assert {"cli.client", "cli.serve"} <= modules, modules
    assert any("--lora" in call[1] for _, _, call in DOCUMENTED)


@pytest.mark.parametrize("doc, line, call", DOCUMENTED, ids=[f"{d}:{c[0]}:{i}" for i, (d, _, c) in
                                                          enumerate(DOCUMENTED)])
def test_a_documented_command_parses(doc, line, call, capsys):
    module, args = call
    try:
        PARSERS[module](args)
    except SystemExit as e:
        assert e.code == 0, f"{doc}: `{line.strip()}` does not parse:\n{capsys.readouterr().err}"


SERVE_VARIABLES = {"HTTP_PORT", "GRPC_PORT", "METRICS_PORT", "GATEWAY_PORT", "OPENAI_PORT", "GATEWAY_LISTEN",
                   "OPENAI_LISTEN", "TRITON_LLM_SET", "TRITON_LLM_SERVER_ARGS", "TRITON_LLM_DRAIN_SECONDS",
                   "TRITON_LLM_LIVENESS_FILE", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_BSP_SCHEDULE_DELAY", "TRITONSERVER"}


@pytest.mark.parametrize("doc, line", [(p.relative_to(REPO).as_posix(), line) for p in DOCS
                                       for line in commands(p.read_text()) if "make serve" in line.split("#")[0]])
def test_make_serve_prefixes_are_variables_it_reads(doc, line):
    tokens = shlex.split(line.split("#")[0])
    prefix = tokens[:tokens.index("make")]
    names = {t.split("=", 1)[0] for t in prefix}
    assert all("=" in t for t in prefix) and names <= SERVE_VARIABLES, f"{doc}: {line}"
    env = dict(t.split("=", 1) for t in prefix)
    for item in shlex.split(env.get("TRITON_LLM_SET", "")):
        serve.parse_overrides([item])
    check_distinct(Ports.from_env(env), gateway_listen_from_env(env))    # the servers it starts get a port each
