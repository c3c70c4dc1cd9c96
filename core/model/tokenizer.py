"""Tokenizer from ``tokenizer.json`` + ``tokenizer_config.json`` (the ``tokenizers`` library).

Also renders the chat template the config carries, in a sandboxed Jinja
environment (templates are data from a checkpoint, not trusted code).
"""
from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from hyspec.errors import CheckpointError, HyspecError


class Tokenizer:
    """A Hugging Face directory's tokenizer, or the one a GGUF file describes in its metadata."""

    def __init__(self, path: str | Path):
        path = Path(path)
        from hyspec.model.gguf_checkpoint import is_gguf

        if is_gguf(path):
            self._from_gguf(path)
        else:
            self._from_directory(path)
        self.chat_template: str | None = self.config.get("chat_template")
        if isinstance(self.chat_template, list):  # HF allows [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in self.chat_template}
            self.chat_template = named.get("default") or next(iter(named.values()), None)
        tmpl_file = path / "chat_template.jinja"
        if self.chat_template is None and not is_gguf(path) and tmpl_file.is_file():
            self.chat_template = tmpl_file.read_text()
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None

    def _from_directory(self, path: Path) -> None:
        from tokenizers import Tokenizer as HFTokenizer

        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise CheckpointError(
                f"{tok_file} not found: hyspec reads fast tokenizers (tokenizer.json); "
                "convert a slow tokenizer with transformers' save_pretrained first")
        try:
            self._tok = HFTokenizer.from_file(str(tok_file))
        except Exception as exc:
            raise CheckpointError(f"{tok_file} cannot be read: {exc}") from None
        cfg_file = path / "tokenizer_config.json"
        self.config: dict[str, Any] = {}
        if cfg_file.is_file():
            try:
                self.config = json.loads(cfg_file.read_text())
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{cfg_file} is not valid JSON: {exc}") from None

    def _from_gguf(self, path: Path) -> None:
        from hyspec.model.gguf_checkpoint import gguf_metadata
        from hyspec.model.gguf_tokenizer import build_gguf_tokenizer

        self._tok, self.config = build_gguf_tokenizer(gguf_metadata(path), path.name)

    def save(self, directory: str | Path) -> None:
        """Write ``tokenizer.json`` + ``tokenizer_config.json`` (a GGUF's tokenizer becomes a plain directory's)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(directory / "tokenizer.json"))
        keys = ("bos_token", "eos_token", "unk_token", "pad_token", "add_bos_token")
        config = {k: self.config[k] for k in keys if self.config.get(k) is not None}
        if self.chat_template:
            config["chat_template"] = self.chat_template
        (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=add_special_tokens).ids
        # tokenizer.json post-processors usually add BOS themselves; honour add_bos_token when they do not.
        if (add_special_tokens and self.config.get("add_bos_token") and self.bos_token_id is not None
                and (not ids or ids[0] != self.bos_token_id)):
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    @cached_property
    def _template(self):
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> str:
        if not self.chat_template:
            raise HyspecError("this model's tokenizer_config.json has no chat_template; use generate() with a prompt")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise HyspecError(f"messages[{i}] must be a dict with 'role' and 'content'")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token or "", eos_token=self.eos_token or "", **kwargs)
        except Exception as exc:
            raise HyspecError(f"chat template failed: {exc}") from None


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # AddedToken serialised as {"content": ...}
        return value.get("content")
    return value


class IncrementalDetokenizer:
    """Text deltas for a growing list of ids; holds back an incomplete UTF-8 tail."""

    __slots__ = ("tokenizer", "skip_special_tokens", "text")

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.text = ""

    def update(self, all_ids: list[int]) -> str:
        """Return the newly completed text after ``all_ids`` (the whole output so far)."""
        full = self.tokenizer.decode(all_ids, skip_special_tokens=self.skip_special_tokens)
        stable = full.rstrip("\ufffd")  # an incomplete UTF-8 sequence: wait for its next byte
        delta = stable[len(self.text):] if len(stable) > len(self.text) else ""
        self.text = stable
        return delta

    def flush(self, all_ids: list[int]) -> str:
        """At the end of a request: emit whatever is left, incomplete characters included."""
        full = self.tokenizer.decode(all_ids, skip_special_tokens=self.skip_special_tokens)
        delta = full[len(self.text):] if len(full) > len(self.text) else ""
        self.text = full
        return delta
