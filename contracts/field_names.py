"""Engine field names and the ensemble inputs a client sets them with.

The engine and ``SamplingParams`` raise ``ValueError("<field>: ...")`` with their own field
names; a client sent TensorRT-LLM input names. This is the one map between the two.
"""
from __future__ import annotations

# engine / SamplingParams field -> the ensemble input that sets it (fields not listed keep their name)
ENSEMBLE_INPUT_FOR_FIELD = {
    "prompt_token_ids": "text_input",
    "stop_token_ids": "end_id",
    "bad_words_ids": "bad_words",
    "n": "num_return_sequences",
    "logprobs": "return_log_probs",
    "guide": "guided_decoding_guide_type",
}


def ensemble_input_name(field: str) -> str:
    return ENSEMBLE_INPUT_FOR_FIELD.get(field, field)


def split_field_error(message: str) -> tuple[str | None, str]:
    """``"n: 65 parallel samples"`` -> ``("n", "65 parallel samples")``; no field prefix -> ``(None, message)``."""
    field, sep, rest = message.partition(":")
    if sep and field and field.replace("_", "").isalnum() and field == field.strip():
        return field, rest.strip()
    return None, message


def as_ensemble_error(message: str) -> str:
    """Rename a leading engine field to the ensemble input: ``"n: ..."`` -> ``"num_return_sequences: ..."``."""
    field, rest = split_field_error(message)
    if field is None:
        return message
    return f"{ensemble_input_name(field)}: {rest}"
