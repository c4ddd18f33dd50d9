"""preprocess.chat_template: rendering equals transformers' apply_chat_template(tokenize=False)."""
from __future__ import annotations

import pytest

from preprocess.chat_template import ChatTemplate, ChatTemplateError, render_chat
from preprocess.tokenizer import load_tokenizer
from tests.helpers.checkpoints import DEMO_TARGET  # noqa: E402

DEMO = DEMO_TARGET

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You write Python."}, {"role": "user", "content": "Sort a list"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "user", "content": "  spaces \n\n and\ttabs  "}],
    [{"role": "user", "content": "你好 😀 <|end|> {{ not jinja }}"}],
    [{"role": "user", "content": ""}],
]

# A ChatML / Llama-3 style template exercising what HF templates use: namespace, loop.first,
# trim/lstrip blocks, tojson, raise_exception, loop controls, bos_token.
RICH_TEMPLATE = """
{%- set ns = namespace(system='') -%}
{%- for m in messages -%}
  {%- if m['role'] == 'system' -%}{%- set ns.system = m['content'] -%}{%- endif -%}
{%- endfor -%}
{{ bos_token }}
{% if ns.system %}<|system|>
{{ ns.system }}<|end|>
{% endif %}
{% for m in messages %}
  {% if m['role'] == 'system' %}{% continue %}{% endif %}
  {% if m['role'] not in ['user', 'assistant'] %}
    {{ raise_exception('unknown role ' + m['role']) }}
  {% endif %}
<|{{ m['role'] }}|>
{{ m['content'] | trim }}{% if m.meta is defined %} {{ m.meta | tojson }}{% endif %}<|end|>
{% endfor %}
{% if add_generation_prompt %}<|assistant|>
{% endif %}
"""


@pytest.fixture(scope="module")
def hf():
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(DEMO))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEMO)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_demo_template_equals_transformers(hf, tok, messages):
    ours = ChatTemplate(tok.chat_template, tok.template_variables()).render(messages, add_generation_prompt=True)
    theirs = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours == theirs
    assert ours.startswith("<|bos|>") and ours.endswith("<|assistant|>\n")


@pytest.mark.parametrize("messages", CONVERSATIONS[:3] + [
    [{"role": "user", "content": "x", "meta": {"k": "<b>é</b>", "n": [1, 2]}}],
    [{"role": "user", "content": "x", "meta": None}],  # None-valued keys are dropped, as HF does
])
@pytest.mark.parametrize("gen", [True, False])
def test_rich_template_equals_transformers(hf, tok, messages, gen):
    ours = render_chat(RICH_TEMPLATE, messages, add_generation_prompt=gen, **tok.template_variables())
    theirs = hf.apply_chat_template(messages, chat_template=RICH_TEMPLATE, tokenize=False,
                                    add_generation_prompt=gen)
    assert ours == theirs


def test_tojson_does_not_escape_html(tok):
    out = render_chat("{{ messages[0]['content'] | tojson }}", [{"role": "user", "content": "<a>&é"}])
    assert out == '"<a>&é"'


def test_raise_exception_becomes_chat_template_error(hf):
    with pytest.raises(ChatTemplateError, match="unknown role tool"):
        render_chat(RICH_TEMPLATE, [{"role": "tool", "content": "x"}], bos_token="<s>")
    with pytest.raises(Exception, match="unknown role tool"):  # transformers agrees
        hf.apply_chat_template([{"role": "tool", "content": "x"}], chat_template=RICH_TEMPLATE, tokenize=False)


def test_sandbox_blocks_python_internals():
    with pytest.raises(ChatTemplateError):
        render_chat("{{ messages.__class__.__mro__[1].__subclasses__() }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):
        render_chat("{% set ns = namespace(_x=1) %}{{ ns._x }}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError):  # immutable sandbox: no mutating the caller's data
        render_chat("{{ messages.append(1) }}", [{"role": "user", "content": "x"}])


def test_bad_template_fails_at_compile():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")


def test_generation_block_renders_its_body():
    t = "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    assert render_chat(t, [{"role": "assistant", "content": "ok"}]) == "ok"


# Gemma's template (Gemma 2's, as published): no system role, user / model turns that must alternate
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}")


def test_gemma_template_refuses_a_system_message_with_its_own_error(hf):
    """A system message gets the template's own message (the request is refused naming ``messages``), not a crash;
    the turns render as transformers renders them."""
    chat = [{"role": "user", "content": "Hi "}, {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Bye"}]
    want = hf.apply_chat_template(chat, chat_template=GEMMA_TEMPLATE, tokenize=False, add_generation_prompt=True)
    assert render_chat(GEMMA_TEMPLATE, chat, bos_token=hf.bos_token) == want
    assert want.endswith("<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    system = [{"role": "system", "content": "Be brief."}, *chat]
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        render_chat(GEMMA_TEMPLATE, system, bos_token="<bos>")
    with pytest.raises(Exception, match="System role not supported"):   # transformers agrees
        hf.apply_chat_template(system, chat_template=GEMMA_TEMPLATE, tokenize=False)
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat(GEMMA_TEMPLATE, chat[:1] * 2, bos_token="<bos>")
