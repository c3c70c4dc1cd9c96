"""Tokenizer from ``tokenizer.json`` + ``tokenizer_config.json`` (the ``tokenizers`` library).

Also renders the chat template the config carries, in a sandboxed Jinja
environment with output-size and time bounds (templates are data from a
checkpoint, not trusted code; core/model/chat_template.py).
"""
from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

from hyspec.errors import CheckpointError, HyspecError
from hyspec.model import chat_inputs
from hyspec.model.chat_template import (ChatTemplateBoundError, RenderBounds, compile_template, find_control_text,
                                        mark_control_text, render)
from hyspec.model.gguf_tokenizer import build_gguf_tokenizer

# Longer texts are encoded through encode_batch, which releases the interpreter lock while Rust works
# (encode holds it: a server's event loop stood still for seconds on a long prompt).
GIL_FREE_ENCODE_CHARS = 1 << 14


class Tokenizer:
    """A Hugging Face directory's tokenizer, or the one a GGUF file describes in its metadata."""

    def __init__(self, path: str | Path):
        path = Path(path)
        # hyspec.model.gguf_checkpoint brings torch: imported here (also in _from_gguf) so that this module, which
        # hyspec.remote.worker imports and so `hyspec --help`, stays torch-free (measured: build_parser loads torch
        # with it at the top)
        from hyspec.model.gguf_checkpoint import is_gguf

        if is_gguf(path):
            self._from_gguf(path)
        else:
            self._from_directory(path)
        self.chat_template: str | None = self.config.get("chat_template")
        # HF allows [{"name": "default", "template": ...}, {"name": "tool_use", ...}, ...]
        self.named_chat_templates: dict[str, str] = {}
        if isinstance(self.chat_template, list):
            self.named_chat_templates = {t.get("name"): t.get("template") for t in self.chat_template}
            named = self.named_chat_templates
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
        map_file = path / "special_tokens_map.json"
        if "added_tokens_decoder" not in self.config and map_file.is_file():
            # An older checkpoint's layout: as transformers reads it, the map's named tokens win over the config's.
            try:
                special = json.loads(map_file.read_text())
            except json.JSONDecodeError as exc:
                raise CheckpointError(f"{map_file} is not valid JSON: {exc}") from None
            self.config.update({k: v for k, v in special.items() if k in chat_inputs.SPECIAL_TOKEN_NAMES and v})

    def _from_gguf(self, path: Path) -> None:
        from hyspec.model.gguf_checkpoint import gguf_metadata
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

    def to_json(self) -> str:
        """The tokenizer as ``tokenizer.json`` text (what grammar engines such as llguidance read)."""
        return self._tok.to_str()

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > GIL_FREE_ENCODE_CHARS:
            # A batch of one gains nothing from rayon; saying so also keeps tokenizers from warning
            # (and disabling itself) in every process forked after it was used.
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
            ids = self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        else:
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

    @property
    def special_tokens(self) -> dict[str, str]:
        """The named special tokens that are set, as a chat template sees them (``bos_token``, ``eos_token``, ...)."""
        named = {name: _token_text(self.config.get(name)) for name in chat_inputs.SPECIAL_TOKEN_NAMES}
        return {name: text for name, text in named.items() if text is not None}

    @cached_property
    def special_token_texts(self) -> list[str]:
        """The text of every special (control) token: ``<|im_start|>``, ``</s>``, ..."""
        return [t.content for t in self._tok.get_added_tokens_decoder().values() if t.special]

    @cached_property
    def _text_only(self):
        """A copy of the tokenizer that encodes special-token text as ordinary text."""
        from tokenizers import Tokenizer as HFTokenizer

        tok = HFTokenizer.from_str(self._tok.to_str())
        tok.encode_special_tokens = True
        return tok

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, *,
                            continue_final_message: bool | str = False, chat_template: str | None = None,
                            chat_template_kwargs: dict[str, Any] | None = None,
                            tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
                            max_output_chars: int | None = None, timeout_s: float | None = None) -> str:
        """The chat prompt's text, rendered as transformers' ``apply_chat_template(tokenize=False)`` renders it
        (core/model/chat_inputs.py), with ``chat_template`` (a template, or the name of one of the checkpoint's
        named templates) in place of the tokenizer's when given.

        ``chat_template_kwargs`` are more template variables (Qwen3's ``enable_thinking``); names the template
        does not read are passed on unused.  ``continue_final_message`` (True, or the field to continue) leaves
        the final message open for the model to continue.  Rendering is bounded (ChatTemplateBoundError past a
        bound): at most ``max_output_chars`` characters and ``timeout_s`` seconds (defaults: RenderBounds').
        Any other failure, a template's ``raise_exception`` included, is a HyspecError with its message."""
        source = self.chat_template_for(chat_template, tools)
        if not source:
            raise HyspecError("this model's tokenizer_config.json has no chat_template; use generate() with a prompt, "
                              "or pass a chat_template")
        defaults = RenderBounds()
        bounds = RenderBounds(max_output_chars or defaults.max_chars, timeout_s or defaults.timeout_s)
        inputs = chat_inputs.prepare(
            messages, source, self.special_tokens, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools, documents=documents,
            chat_template_kwargs=chat_template_kwargs)
        try:
            rendered = render(compile_template(source), bounds, **inputs.variables)
        except ChatTemplateBoundError:
            raise
        except Exception as exc:  # the template's own raise_exception, a syntax error, a type error in it, ...
            raise HyspecError(f"chat template failed: {exc}") from None
        return inputs.finish(rendered)

    def chat_template_for(self, chat_template: str | None, tools: list[dict[str, Any]] | None) -> str | None:
        """As transformers picks it: ``chat_template`` (a template, or the name of one of the checkpoint's), else
        the checkpoint's ``tool_use`` template when tools are given, else the tokenizer's own."""
        if chat_template is not None:
            return self.named_chat_templates.get(chat_template, chat_template)
        if (tools is not None and "tool_use" in self.named_chat_templates
                and self.chat_template == self.named_chat_templates.get("default")):  # not replaced by the operator
            return self.named_chat_templates["tool_use"]
        return self.chat_template

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                    split_special_tokens_in_content: bool = True, **options: Any) -> tuple[str, list[int]]:
        """(text, ids) of the chat prompt; no special tokens are added (the template writes any BOS it wants).
        ``options`` are apply_chat_template's (continue_final_message, chat_template, chat_template_kwargs, bounds).

        With ``split_special_tokens_in_content``, control-token text (``<|im_start|>``) in the content of a
        message that is not the operator's (system, developer) is encoded as text, so that a user cannot
        open a turn of another role; the template's own control tokens stay control tokens.  Control-token text
        in ``chat_template_kwargs`` or ``documents`` (which a template may write anywhere) is refused instead."""
        if split_special_tokens_in_content:
            for field in ("chat_template_kwargs", "documents"):
                found = find_control_text(options.get(field), self.special_token_texts)
                if found is not None:
                    raise chat_inputs.ChatInputError(field, f"{field} holds the control-token text {found!r}, which "
                                                            "could open a turn of another role: leave it out")
        marked = mark_control_text(messages, self.special_token_texts if split_special_tokens_in_content else [])
        if not marked.originals:
            text = self.apply_chat_template(messages, add_generation_prompt, **options)
            return text, self.encode(text, add_special_tokens=False)
        parts = marked.split(self.apply_chat_template(marked.messages, add_generation_prompt, **options))
        text, ids = [], []
        for part in parts:
            if isinstance(part, int):
                original = marked.originals[part]
                text.append(original)
                ids += self._text_only.encode(original, add_special_tokens=False).ids
            elif part:
                text.append(part)
                ids += self.encode(part, add_special_tokens=False)
        return "".join(text), ids


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
