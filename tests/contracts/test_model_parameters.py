"""Every model refuses the parameters it does not read, naming the key and the model; names from
TensorRT-LLM and vLLM get the answer their table entry documents (contracts/foreign_parameters.py), and
docs/deploy.md shows the same table. The shipped model repository, and what ``TRITON_LLM_SET`` renders
into it, pass the same checks."""
from __future__ import annotations

import re

import pytest

from backend.config import EngineConfig
from backend.serving.llm_startup import LLM_PARAMETERS, build_llm_serving
from bench.harness.server import pbtxt_parameters
from cli.launcher import MODEL_REPOSITORY, render_model_repository
from cli.serve import parse_overrides, settings_from_env
from contracts.foreign_parameters import FOREIGN_PARAMETERS, ForeignParameter
from contracts.triton_config import TRITON_PARAMETERS, check_known_parameters
from postprocess.serving import POSTPROCESS_PARAMETERS, PostprocessServing
from preprocess.serving import PREPROCESS_PARAMETERS, PreprocessServing
from tests.helpers.triton_fakes import make_pb_utils
from tests.repo.code_tree import REPO

KNOWN = {"llm": LLM_PARAMETERS, "preprocess": PREPROCESS_PARAMETERS, "postprocess": POSTPROCESS_PARAMETERS}
LOADERS = {"llm": lambda cfg: build_llm_serving(cfg, make_pb_utils()),
           "preprocess": lambda cfg: PreprocessServing.from_model_config(cfg, make_pb_utils()),
           "postprocess": lambda cfg: PostprocessServing.from_model_config(cfg, make_pb_utils())}


def model_config(model: str, params: dict[str, str]) -> dict:
    """A model's config as Triton hands it to ``initialize`` (the shipped parameters, then ``params``)."""
    shipped = pbtxt_parameters((MODEL_REPOSITORY / model / "config.pbtxt").read_text())
    merged = {**shipped, **params}
    return {"name": model, "input": [], "parameters": {k: {"string_value": v} for k, v in merged.items()}}


def refusal(model: str, key: str) -> str:
    with pytest.raises(ValueError) as e:
        check_known_parameters(model, {key: "1"}, KNOWN[model])
    return str(e.value)


@pytest.mark.parametrize("model", sorted(LOADERS))
def test_each_model_refuses_an_unknown_parameter_at_load_naming_it_and_the_model(model):
    with pytest.raises(ValueError, match=rf"^no_such_setting: not a parameter of the {model} model \(each model's "):
        LOADERS[model](model_config(model, {"no_such_setting": "1"}))


@pytest.mark.parametrize("model, key, expected", [
    ("llm", "tensor_parallel_size", "vLLM's name; not implemented here: one engine runs on one GPU"),
    ("llm", "kv_cache_free_gpu_mem_fraction", "TensorRT-LLM's name; set llm.gpu_memory_utilization or "
                                              "llm.kv_cache_bytes: "),
    ("llm", "max_num_seq", "did you mean 'max_num_seqs'?"),                  # a typo of a field
    ("llm", "metrics_intervals_s", "did you mean 'metrics_interval_s'?"),    # a typo of a serving parameter
    ("preprocess", "tokenizer_dir", "TensorRT-LLM's name; set preprocess.tokenizer_path: "),
    ("postprocess", "max_state", "did you mean 'max_states'?"),
])
def test_a_refusal_names_what_to_set(model, key, expected):
    with pytest.raises(ValueError) as e:
        LOADERS[model](model_config(model, {key: "1"}))
    assert str(e.value).startswith(f"{key}: not a parameter of the {model} model ({expected}"), str(e.value)


def test_every_unknown_key_is_named_at_once():
    with pytest.raises(ValueError) as e:
        check_known_parameters("llm", {"model_path": "m", "b_unknown": "1", "a_unknown": "2"}, LLM_PARAMETERS)
    assert re.fullmatch(r"a_unknown: not a parameter of the llm model \(.*\); "
                        r"b_unknown: not a parameter of the llm model \(.*\)", str(e.value)), str(e.value)


def test_the_engine_config_refuses_the_same_way_and_allows_tritons_own_keys():
    with pytest.raises(ValueError, match=r"^gpu_device_ids: not a parameter of the llm model \(TensorRT-LLM's name; "
                                         r"set llm\.device: "):
        EngineConfig.from_parameters({"model_path": "/m", "gpu_device_ids": "0"})
    params = {"model_path": "/m", "EXECUTION_ENV_PATH": "$$TRITON_MODEL_DIRECTORY/env.tar.gz",
              "FORCE_CPU_ONLY_INPUT_TENSORS": "no"}
    assert EngineConfig.from_parameters(params).model.model_path == "/m"
    for model, known in KNOWN.items():
        check_known_parameters(model, {k: "x" for k in TRITON_PARAMETERS}, known)


@pytest.mark.parametrize("name", sorted(FOREIGN_PARAMETERS))
def test_each_foreign_name_gets_its_documented_answer(name):
    entry = FOREIGN_PARAMETERS[name]
    for model in KNOWN:
        assert name not in KNOWN[model] and name not in TRITON_PARAMETERS, f"{name} is ours on {model}"
        assert refusal(model, name) == f"{name}: not a parameter of the {model} model ({entry.answer(model)})"
    for use in entry.use:     # each equivalent is a parameter its model reads
        model, _, key = use.partition(".")
        assert key in KNOWN.get(model, ()), f"{name}: {use} is not a parameter of the {model} model"
    mine = [u for u in entry.use if u.startswith("llm.")]
    answer = entry.answer("llm")
    if entry.use:
        assert answer.startswith(f"{entry.origin}'s name; set {' or '.join(mine or entry.use)}"), answer
    else:
        assert answer == f"{entry.origin}'s name; not implemented here: {entry.note}"


def test_an_answer_names_the_equivalent_of_the_model_it_was_set_on():
    entry = FOREIGN_PARAMETERS["tokenizer_dir"]
    assert "set postprocess.tokenizer_path" in entry.answer("postprocess")
    assert "preprocess.tokenizer_path" not in entry.answer("postprocess")
    assert "set preprocess.tokenizer_path or postprocess.tokenizer_path" in entry.answer("llm")
    with pytest.raises(ValueError, match="without an equivalent needs a note"):
        ForeignParameter("x", "vLLM")


def deploy_doc_table() -> dict[str, tuple[str, str]]:
    text = (REPO / "docs" / "deploy.md").read_text()
    match = re.search(r"^### Names from TensorRT-LLM and vLLM\n(.*?)(?=^#|\Z)", text, re.S | re.M)
    assert match, "docs/deploy.md has no '### Names from TensorRT-LLM and vLLM' section"
    rows = {}
    for line in match.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `"):
            rows[cells[0].strip("`")] = (cells[1], cells[2])
    return rows


def test_the_deploy_doc_lists_every_foreign_name_with_its_answer():
    rows = deploy_doc_table()
    assert list(rows) == list(FOREIGN_PARAMETERS), (
        f"docs/deploy.md vs contracts/foreign_parameters.py: missing {sorted(set(FOREIGN_PARAMETERS) - set(rows))}, "
        f"not in the table {sorted(set(rows) - set(FOREIGN_PARAMETERS))} (or out of order)")
    for name, (origin, answer) in rows.items():
        entry = FOREIGN_PARAMETERS[name]
        assert origin == entry.origin, f"{name}: docs say it comes from {origin}"
        use = " or ".join(f"`{u}`" for u in entry.use) or "not implemented"
        assert answer == (f"{use}: {entry.note}" if entry.note else use), f"{name}: docs say {answer!r}"


def test_the_shipped_model_repository_passes_every_model_check():
    for model, known in KNOWN.items():
        check_known_parameters(model, pbtxt_parameters((MODEL_REPOSITORY / model / "config.pbtxt").read_text()), known)


def test_triton_llm_set_items_reach_the_same_refusal(tmp_path):
    """$TRITON_LLM_SET is rendered into the model repository like --set; each model refuses its unknown key."""
    env = {"TRITON_LLM_SET": "llm.tensor_parallel_size=2 preprocess.no_such=1 'postprocess.tokenizer_dir=/t'"}
    items, _ = settings_from_env(env)
    repo = render_model_repository(tmp_path / "repo", parse_overrides(items))
    expected = {"llm": "tensor_parallel_size", "preprocess": "no_such", "postprocess": "tokenizer_dir"}
    for model, key in expected.items():
        params = pbtxt_parameters((repo / model / "config.pbtxt").read_text())
        with pytest.raises(ValueError, match=rf"^{key}: not a parameter of the {model} model \("):
            check_known_parameters(model, params, KNOWN[model])
