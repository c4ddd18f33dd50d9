"""A checkpoint folder's tokenizer: ``tokenizer.json`` through ``tokenizers``, plus its HF config.

Reads ``tokenizer.json`` (required), ``tokenizer_config.json`` (special tokens, ``add_bos_token``,
``add_eos_token``, ``chat_template``, ``model_max_length``), ``special_tokens_map.json`` (fallback
for special tokens) and ``generation_config.json`` (EOS ids). Special tokens may be plain strings or
HF ``AddedToken`` dicts (``{"content": "<s>", ...}``).

BOS/EOS insertion follows HF ``PreTrainedTokenizerFast``: when ``tokenizer_config.json`` sets
``add_bos_token`` or ``add_eos_token`` explicitly, or ``tokenizer.json`` has no post-processor, the
post-processor is rebuilt from those flags; otherwise ``tokenizer.json``'s own post-processor decides.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import processors


class TokenizerError(ValueError):
    """A tokenizer file is missing or malformed; the message names the file."""


@dataclass(frozen=True)
class TokenizerConfig:
    """What the serving path needs from ``tokenizer_config.json`` and ``generation_config.json``."""

    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    unk_token: str | None = None
    additional_special_tokens: tuple[str, ...] = ()
    add_bos_token: bool | None = None   # None: not set in the config (tokenizer.json decides)
    add_eos_token: bool | None = None
    chat_template: str | None = None
    model_max_length: int | None = None
    generation_eos_token_ids: tuple[int, ...] = ()


def _token_content(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{where}: expected a string or {{'content': ...}}, got {value!r}")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path}: unreadable JSON ({e})") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    return data


def _chat_template(value: Any, where: str) -> str | None:
    """A string, or HF's list form ``[{"name": "default", "template": ...}, ...]``."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        template = named.get("default")
        if isinstance(template, str):
            return template
    raise TokenizerError(f"{where}: chat_template must be a string or a list with a 'default' entry")


def read_tokenizer_config(folder: str | Path) -> TokenizerConfig:
    """Parse the JSON configs beside ``tokenizer.json`` (each optional)."""
    folder = Path(folder)
    cfg_path, map_path = folder / "tokenizer_config.json", folder / "special_tokens_map.json"
    cfg = _read_json(cfg_path) if cfg_path.is_file() else {}
    smap = _read_json(map_path) if map_path.is_file() else {}
    template_file = folder / "chat_template.jinja"
    template = _chat_template(cfg.get("chat_template"), str(cfg_path))
    if template is None and template_file.is_file():
        template = template_file.read_text(encoding="utf-8")

    def special(name: str) -> str | None:
        value = cfg.get(name, smap.get(name))
        return _token_content(value, f"{cfg_path if name in cfg else map_path}: {name}")

    extra = cfg.get("additional_special_tokens", smap.get("additional_special_tokens")) or []
    if not isinstance(extra, list):
        raise TokenizerError(f"{cfg_path}: additional_special_tokens must be a list")
    additional = tuple(t for t in (_token_content(v, f"{cfg_path}: additional_special_tokens") for v in extra) if t)

    gen_eos: tuple[int, ...] = ()
    gen_path = folder / "generation_config.json"
    if gen_path.is_file():
        eos = _read_json(gen_path).get("eos_token_id")
        ids = eos if isinstance(eos, list) else ([] if eos is None else [eos])
        if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise TokenizerError(f"{gen_path}: eos_token_id must be an int or a list of ints, got {eos!r}")
        gen_eos = tuple(ids)

    def flag(name: str) -> bool | None:
        value = cfg.get(name)
        if value is not None and not isinstance(value, bool):
            raise TokenizerError(f"{cfg_path}: {name} must be true or false, got {value!r}")
        return value

    max_len = cfg.get("model_max_length")
    if not isinstance(max_len, int) or isinstance(max_len, bool) or max_len <= 0 or max_len > 10**9:
        max_len = None  # HF writes 1e30 for "no limit"
    return TokenizerConfig(
        bos_token=special("bos_token"), eos_token=special("eos_token"), pad_token=special("pad_token"),
        unk_token=special("unk_token"), additional_special_tokens=additional,
        add_bos_token=flag("add_bos_token"), add_eos_token=flag("add_eos_token"),
        chat_template=template, model_max_length=max_len, generation_eos_token_ids=gen_eos,
    )


class Tokenizer:
    """Encode/decode with a checkpoint's tokenizer. Immutable after construction; thread-safe for reads."""

    def __init__(self, backend: _HFTokenizer, config: TokenizerConfig, identity: str) -> None:
        self._tok = backend
        self.config = config
        self.identity = identity
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token_id = self._id_of(config.bos_token)
        self.eos_token_id = self._id_of(config.eos_token)
        self.pad_token_id = self._id_of(config.pad_token)
        eos = list(config.generation_eos_token_ids)
        if self.eos_token_id is not None and self.eos_token_id not in eos:
            eos.append(self.eos_token_id)
        self.eos_token_ids: tuple[int, ...] = tuple(eos)
        decoder = backend.get_added_tokens_decoder()
        self.special_token_ids: frozenset[int] = frozenset(i for i, t in decoder.items() if t.special)
        if config.add_bos_token is not None or config.add_eos_token is not None or backend.post_processor is None:
            self._tok.post_processor = self._template_processor()

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    def _template_processor(self) -> processors.TemplateProcessing:
        bos = self.config.bos_token if self.config.add_bos_token and self.bos_token_id is not None else None
        eos = self.config.eos_token if self.config.add_eos_token and self.eos_token_id is not None else None
        single = " ".join(([f"{bos}:0"] if bos else []) + ["$A:0"] + ([f"{eos}:0"] if eos else []))
        pair = single + " " + " ".join(([f"{bos}:1"] if bos else []) + ["$B:1"] + ([f"{eos}:1"] if eos else []))
        specials = ([(bos, self.bos_token_id)] if bos else []) + ([(eos, self.eos_token_id)] if eos else [])
        return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)

    @property
    def chat_template(self) -> str | None:
        return self.config.chat_template

    @property
    def model_max_length(self) -> int | None:
        return self.config.model_max_length

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def template_variables(self) -> dict[str, Any]:
        """The special-token variables HF passes to chat templates (``bos_token``, ``eos_token``, ...)."""
        c = self.config
        names = {"bos_token": c.bos_token, "eos_token": c.eos_token, "pad_token": c.pad_token, "unk_token": c.unk_token}
        out: dict[str, Any] = {k: v for k, v in names.items() if v is not None}
        if c.additional_special_tokens:
            out["additional_special_tokens"] = list(c.additional_special_tokens)
        return out


def tokenizer_identity(tokenizer_json: bytes, config: TokenizerConfig) -> str:
    """sha256 over ``tokenizer.json`` bytes and the settings that change ids (special tokens, BOS/EOS flags)."""
    h = hashlib.sha256()
    h.update(tokenizer_json)
    meta = {
        "bos": config.bos_token, "eos": config.eos_token, "pad": config.pad_token, "unk": config.unk_token,
        "extra": list(config.additional_special_tokens),
        "add_bos": config.add_bos_token, "add_eos": config.add_eos_token,
    }
    h.update(b"\0" + json.dumps(meta, sort_keys=True).encode())
    return h.hexdigest()


def load_tokenizer(folder: str | Path) -> Tokenizer:
    """Load ``folder``'s tokenizer; raises ``TokenizerError`` naming the file on any problem."""
    folder = Path(folder)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise TokenizerError(f"{path}: missing file (only tokenizer.json tokenizers are supported)")
    raw = path.read_bytes()
    try:
        backend = _HFTokenizer.from_str(raw.decode("utf-8"))
    except Exception as e:  # tokenizers raises its own exception type
        raise TokenizerError(f"{path}: not a valid tokenizers file ({e})") from e
    config = read_tokenizer_config(folder)
    return Tokenizer(backend, config, tokenizer_identity(raw, config))
