"""Render chat ``messages`` with a checkpoint's jinja2 chat template, the way HF transformers does.

Same environment as ``transformers.utils.chat_template_utils``: ``ImmutableSandboxedEnvironment``
with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}``
block (rendered as its body), a ``tojson`` filter that does not HTML-escape, and the globals
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``. The template sees ``messages``,
``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's special tokens
(``bos_token``, ``eos_token``, ...). Message keys whose value is ``None`` are dropped, as HF does.
Templates are untrusted: everything runs in the sandbox.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template does not compile, or rendering failed (including its own ``raise_exception``)."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` marks assistant text for training masks; render the body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _TemplateDict:
    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """A namespace that refuses underscore-prefixed attributes (no reaching into CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set namespace attribute {name!r}")


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template plus the special-token variables it may read."""

    source: str
    variables: Mapping[str, Any] = field(default_factory=dict)
    _compiled: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            compiled = _environment().from_string(self.source)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(f"chat_template does not compile: {e}") from e
        object.__setattr__(self, "_compiled", compiled)

    def render(self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
               tools: list | None = None, documents: list | None = None, **extra: Any) -> str:
        """The prompt text for ``messages``. Raises ``ChatTemplateError`` with the template's message."""
        chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
        kwargs = {**self.variables, **extra}
        try:
            return self._compiled.render(messages=chat, tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, **kwargs)
        except jinja2.exceptions.TemplateError as e:
            raise ChatTemplateError(str(e)) from e
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
            raise ChatTemplateError(f"chat_template failed: {type(e).__name__}: {e}") from e


def render_chat(template: str, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True,
                **variables: Any) -> str:
    """One-shot helper: compile ``template`` and render ``messages`` (``variables``: bos_token, ...)."""
    return ChatTemplate(template, variables).render(messages, add_generation_prompt=add_generation_prompt)
