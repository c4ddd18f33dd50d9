"""cli/client.py's command line: the demo's best defaults, every sampling option, GRPC_PORT, escapes,
the guided-decoding flags."""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

import cli.client as client
from tests.helpers.api_docs import config_tensors


def test_defaults_are_greedy_with_the_readme_repetition_penalty():
    opts = client.sampling_options(client.parse_args(["def f():"]))
    assert opts["temperature"] == 0.0 and opts["repetition_penalty"] == 1.2 and opts["max_tokens"] == 64
    assert {k for k, v in opts.items() if v is not None} == {"temperature", "repetition_penalty", "max_tokens"}


def test_every_sampling_input_has_a_flag():
    flags = {name for _, name, *_ in client.SAMPLING_FLAGS} | {name for _, name, _ in client.LIST_FLAGS}
    sampling = {"max_tokens", "temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                "frequency_penalty", "seed", "min_tokens", "end_id", "num_return_sequences", "stop_words",
                "bad_words"}
    assert sampling <= flags <= set(config_tensors("input"))
    args = client.parse_args(["p", "--temperature", "0.8", "--top-p", "0.9", "--top-k", "5", "--min-p", "0.1",
                              "--presence-penalty", "0.5", "--frequency-penalty", "-0.5", "--seed", "3",
                              "--min-tokens", "2", "--end-id", "7", "--n", "2", "--stop", "a", "--stop", "b",
                              "--bad-words", "x", "--num-speculative-tokens", "0", "--lora", "sql", "--ignore-eos",
                              "--logit-bias", "17=-100", "--logit-bias", "5=2.5"])
    opts = client.sampling_options(args)
    assert opts == {"max_tokens": 64, "temperature": 0.8, "repetition_penalty": 1.2, "top_k": 5, "top_p": 0.9,
                    "min_p": 0.1, "presence_penalty": 0.5, "frequency_penalty": -0.5, "seed": 3, "min_tokens": 2,
                    "end_id": 7, "num_return_sequences": 2, "num_speculative_tokens": 0, "stop_words": ["a", "b"],
                    "bad_words": ["x"], "lora_name": "sql", "ignore_eos": True, "logit_bias": {17: -100.0, 5: 2.5}}
    assert client.to_array("logit_bias", opts["logit_bias"]).tolist() == [[b'{"17": -100.0, "5": 2.5}']]
    client.build_inputs("p", 4, **{k: v for k, v in opts.items() if k != "max_tokens"})   # all typed inputs


@pytest.mark.parametrize("text", ["17", "x=1", "17=high", "=1"])
def test_a_bad_logit_bias_flag_exits_2(text, capsys):
    with pytest.raises(SystemExit) as e:
        client.parse_args(["p", "--logit-bias", text])
    assert e.value.code == 2 and "--logit-bias" in capsys.readouterr().err


def test_stop_escapes():
    assert client.parse_args(["p", "--stop", r"\n\n"]).stop == ["\n\n"]
    assert client.unescape(r"a\tb\\n") == "a\tb\\n"


def test_port_from_grpc_port(monkeypatch):
    monkeypatch.setenv("GRPC_PORT", "9101")
    try:
        assert importlib.reload(client).parse_args(["p"]).url == "localhost:9101"
    finally:
        monkeypatch.delenv("GRPC_PORT")
        importlib.reload(client)
    assert client.parse_args(["p"]).url == "localhost:8001"


def test_help_shows_defaults():
    out = subprocess.run([sys.executable, "-m", "cli.client", "--help"], capture_output=True, text=True,
                         cwd=client.__file__.rsplit("/cli/", 1)[0], check=True).stdout
    flat = " ".join(out.split())
    for text in ("(default: 64)", "(default: 0.0)", "(default: 1.2)", "(default: localhost:", "greedy"):
        assert text in flat, text


def test_no_server_is_a_clean_error(capsys):
    assert client.main(["p", "--url", "localhost:1", "--no-echo"]) == 1
    assert "error:" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["p", "--temperature", "x"], ["p", "--n", "1.5"]])
def test_bad_flags_exit_2(argv):
    with pytest.raises(SystemExit) as e:
        client.parse_args(argv)
    assert e.value.code == 2


def ns(**kw):
    base = dict(json=False, json_schema=None, regex=None, grammar=None)
    return argparse.Namespace(**{**base, **kw})


def test_guide_flags(tmp_path):
    schema = tmp_path / "s.json"
    schema.write_text('{"type": "integer"}')
    grammar = tmp_path / "g.ebnf"
    grammar.write_text('root ::= "a"')
    assert client.guide_options(ns()) == {}
    assert client.guide_options(ns(json=True)) == {"guided_decoding_guide_type": "json"}
    assert client.guide_options(ns(json_schema=str(schema))) == {"guided_decoding_guide_type": "json_schema",
                                                          "guided_decoding_guide": '{"type": "integer"}'}
    assert client.guide_options(ns(regex="[0-9]+")) == {"guided_decoding_guide_type": "regex",
                                                 "guided_decoding_guide": "[0-9]+"}
    assert client.guide_options(ns(grammar=str(grammar)))["guided_decoding_guide"] == 'root ::= "a"'


def test_one_guide_at_a_time():
    with pytest.raises(SystemExit):
        client.main(["x", "--json", "--regex", "a"])


@pytest.mark.parametrize("mode", [[], ["--gateway"]], ids=["direct", "gateway"])
def test_no_server_says_nothing_listens_on_the_port(mode, capsys):
    from cli.launcher import free_port

    port = free_port()
    assert client.main(["p", "--url", f"localhost:{port}", "--no-echo", *mode]) == 1
    err = capsys.readouterr().err
    assert f"nothing listens on localhost:{port}" in err and "make serve" in err, err
    assert "stream is no longer in valid state" not in err


@pytest.mark.parametrize("argv, flag", [(["p", "--token", "t"], "--token"), (["p", "--tls-ca", "ca.pem"], "--tls-ca"),
                                        (["p", "--gateway", "--model", "llm"], "--model")])
def test_a_flag_the_mode_cannot_honour_is_refused_by_name(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        client.parse_args(argv)
    assert e.value.code == 2
    assert f"error: {flag}:" in capsys.readouterr().err


class RecordingService:
    """A gateway stand-in that records the request and streams two deltas and a final message."""

    def __init__(self):
        self.requests = []

    def Generate(self, request, context):
        from triton_llm.v1 import llm_service_pb2 as pb

        self.requests.append(request)
        yield pb.GenerateResponse(text="ab", num_output_tokens=1)
        yield pb.GenerateResponse(text="c", num_output_tokens=2, finish_reason=pb.FINISH_REASON_STOP,
                                  usage=pb.Usage(prompt_tokens=5, completion_tokens=2))


@pytest.fixture
def fake_gateway():
    from concurrent import futures

    import grpc

    from triton_llm.v1 import llm_service_pb2_grpc as pb_grpc

    service = RecordingService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = pb_grpc.LLMServiceServicer()
    handler.Generate = service.Generate
    pb_grpc.add_LLMServiceServicer_to_server(handler, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"localhost:{port}", service
    server.stop(0)


GUIDE_FLAGS = [(["--json"], "any_json", ""), (["--json-schema", "SCHEMA"], "json_schema", '{"type": "integer"}'),
               (["--regex", "[0-9]+"], "regex", "[0-9]+"), (["--grammar", "GRAMMAR"], "ebnf_grammar", 'root ::= "a"')]


@pytest.mark.parametrize("flags, case, text", GUIDE_FLAGS, ids=[g[1] for g in GUIDE_FLAGS])
def test_gateway_mode_sends_the_guide(fake_gateway, tmp_path, capsys, flags, case, text):
    url, service = fake_gateway
    (tmp_path / "s.json").write_text('{"type": "integer"}')
    (tmp_path / "g.ebnf").write_text('root ::= "a"')
    flags = [{"SCHEMA": str(tmp_path / "s.json"), "GRAMMAR": str(tmp_path / "g.ebnf")}.get(f, f) for f in flags]
    assert client.main(["p", "--gateway", "--url", url, "--no-echo", *flags]) == 0
    req = service.requests[-1]
    assert req.guided_decoding.WhichOneof("guide") == case
    assert (getattr(req.guided_decoding, case) if case != "any_json" else "") == text
    out = capsys.readouterr()
    assert out.out == "abc"
    assert "finish_reason=stop output_tokens=2" in out.err and "prompt_tokens=5" in out.err


def test_gateway_mode_sends_every_sampling_flag(fake_gateway, capsys):
    url, service = fake_gateway
    argv = ["p", "--temperature", "0.5", "--top-p", "0.9", "--top-k", "5", "--min-p", "0.25",
            "--presence-penalty", "0.5", "--frequency-penalty", "-0.5", "--seed", "3", "--min-tokens", "2",
            "--end-id", "7", "--n", "1", "--stop", "a", "--stop", "b", "--bad-words", "x",
            "--num-speculative-tokens", "0", "--lora", "sql", "--max-tokens", "9", "--chat", "--ignore-eos",
            "--logit-bias", "17=-100", "--logit-bias", "5=2.5"]
    assert client.main([*argv, "--gateway", "--url", url]) == 0
    req = service.requests[-1]
    opts = client.sampling_options(client.parse_args(argv))
    for name, value in opts.items():
        got = getattr(req, name)
        got = list(got) if isinstance(value, list) else dict(got) if isinstance(value, dict) else got
        assert got == pytest.approx(value), name
        if req.DESCRIPTOR.fields_by_name[name].has_presence:
            assert req.HasField(name), name
    assert req.messages.messages[0].content == "p" and req.stream and req.exclude_input_in_output
