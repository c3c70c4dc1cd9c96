"""The engine: requests in, one scheduled step at a time, outputs out.

One step: schedule (continuous batching) -> optional drafting -> one packed
target forward over every prefill chunk, decode token and draft tree ->
sample or verify -> append tokens through the shared stopping rules -> free
finished requests' KV.  Speculation lives in :mod:`hyspec.spec.decoder`; with
no speculative config, or when the dispatcher picks ``none``, every decode is
a plain one-token step.
"""
from __future__ import annotations

import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from hyspec.engine.model_runner import LAST_LOGITS, NO_LOGITS, Feed, ModelRunner
from hyspec.engine.outputs import CompletionOutput, RequestOutput
from hyspec.engine.sampler import sample_next_tokens
from hyspec.engine.sampling_params import SamplingParams
from hyspec.engine.scheduler import Scheduler, SchedulerConfig
from hyspec.engine.sequence import Sequence, Status
from hyspec.engine.stopping import append_token, find_stop_string
from hyspec.errors import ConfigError, KVOwnershipError, RequestError
from hyspec.kv.pool import KVPool
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import IncrementalDetokenizer, Tokenizer

log = logging.getLogger(__name__)

PromptType = str | list[int] | dict[str, Any]


class LLMEngine:
    def __init__(
        self,
        model: str | Path,
        *,
        backend: str | None = "auto",
        dtype: str = "auto",
        max_model_len: int | None = None,
        block_size: int = 16,
        memory_fraction: float = 0.8,
        kv_cache_bytes: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
        speculative_config: dict | str | None = None,
        tokenizer: str | Path | None = None,
    ):
        from hyspec.backends.registry import get_backend

        self.backend = get_backend(None if backend in (None, "auto") else backend)
        self.device = self.backend.device
        path = Path(model)
        self.model_path = path
        from hyspec.model.config import ModelConfig

        cfg = ModelConfig.from_pretrained(path)  # first: it names a missing directory plainly
        # tokenizer: a directory with tokenizer.json, for a GGUF file that carries no vocabulary (vLLM's argument)
        self.tokenizer = Tokenizer(path if tokenizer is None else tokenizer)
        if max_model_len is None:
            max_model_len = cfg.max_position_embeddings
        if not 1 < max_model_len:
            raise ConfigError("max_model_len", f"must be at least 2, got {max_model_len}")
        if max_model_len > cfg.max_position_embeddings and cfg.rope.rope_type == "default":
            raise ConfigError("max_model_len", f"{max_model_len} exceeds the model's max_position_embeddings "
                                               f"({cfg.max_position_embeddings}) and it has no RoPE scaling")
        self.max_model_len = max_model_len
        self.model = load_model(path, dtype=dtype, device=self.device, ops=self.backend.ops,
                                max_positions=max_model_len + 64)  # + room for draft positions past the end
        self.model = self.backend.optimize_model(self.model)
        self.config = self.model.config
        self.dtype = self.model.embed_tokens.weight.dtype
        if self.tokenizer.vocab_size > self.config.vocab_size:
            raise ConfigError("model", f"tokenizer has {self.tokenizer.vocab_size} tokens but the model only "
                                       f"{self.config.vocab_size} embeddings")
        self.eos_ids = frozenset(self._eos_ids(path))

        page_bytes = KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                           self.dtype, block_size)
        budget = self.backend.kv_cache_budget_bytes(memory_fraction, kv_cache_bytes)
        self.pool = KVPool.for_budget(budget, page_bytes, self.device)
        self.layout = self.pool.register("target", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                         self.dtype, block_size)
        capacity = self.pool.num_pages * self.layout.block_size
        if capacity < max_model_len:
            raise ConfigError("kv_cache_bytes" if self.device.type == "cpu" else "memory_fraction",
                              f"the KV pool holds {capacity} tokens, less than one max_model_len sequence "
                              f"({max_model_len}); give the cache more memory or lower max_model_len")
        self.runner = ModelRunner(self.model, self.layout, self.device)
        self.scheduler = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len))
        self._ids = itertools.count()
        self._requests: dict[str, Sequence] = {}
        self.spec = None
        if speculative_config is not None:
            from hyspec.spec.decoder import SpecDecoder

            self.spec = SpecDecoder.create(self, speculative_config)
        log.info("engine ready: %s on %s, %d KV pages of %d tokens", path.name, self.backend.name,
                 self.pool.num_pages, block_size)

    def _eos_ids(self, path: Path) -> set[int]:
        ids = set(self.config.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        gen = path / "generation_config.json"
        if gen.is_file():
            try:
                eos = json.loads(gen.read_text()).get("eos_token_id")
                ids.update(eos if isinstance(eos, list) else [] if eos is None else [eos])
            except json.JSONDecodeError:
                log.warning("ignoring unreadable %s", gen)
        return ids

    # -- requests --------------------------------------------------------------------------------

    def add_request(self, prompt: PromptType, params: SamplingParams | None = None,
                    request_id: str | None = None) -> Sequence:
        """Validate and queue a request; raises RequestError without disturbing other requests."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError("params must be a hyspec.SamplingParams")
        if params.min_tokens:
            raise RequestError("min_tokens is not supported by hyspec (it changes the sampled distribution)")
        text, ids = self._tokenize(prompt)
        if not ids:
            raise RequestError("the prompt is empty")
        if len(ids) >= self.max_model_len:
            raise RequestError(f"the prompt has {len(ids)} tokens; max_model_len is {self.max_model_len} "
                               "(the prompt plus at least one generated token must fit)")
        vocab = self.config.vocab_size
        if min(ids) < 0 or max(ids) >= vocab:
            raise RequestError(f"prompt_token_ids must be in [0, {vocab})")
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        if request_id in self._requests:
            raise RequestError(f"request id {request_id!r} is already in use")
        seq = Sequence(request_id, text, ids, params, SequenceKV(self.pool, self.layout))
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        if self.spec is not None:
            self.spec.on_add(seq)
        self._requests[request_id] = seq
        self.scheduler.add(seq)
        return seq

    def _tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            return prompt, self._encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), _int_list(prompt["prompt_token_ids"])
            if "prompt" in prompt and isinstance(prompt["prompt"], str):
                return prompt["prompt"], self._encode(prompt["prompt"])
            raise RequestError("a prompt dict needs 'prompt' (str) or 'prompt_token_ids' (list of int)")
        if isinstance(prompt, (list, tuple)):
            return None, _int_list(prompt)
        raise RequestError(f"a prompt must be a string, a list of token ids or a dict, not {type(prompt).__name__}")

    def _encode(self, text: str) -> list[int]:
        try:
            return self.tokenizer.encode(text)
        except (TypeError, ValueError, UnicodeError) as exc:  # e.g. unpaired UTF-16 surrogates
            raise RequestError(f"the prompt cannot be tokenized: {exc}") from None

    def abort_request(self, request_id: str) -> None:
        seq = self._requests.pop(str(request_id), None)
        if seq is not None and not seq.finished:
            seq.finish_reason = "abort"
            self._finish(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished

    # -- stepping --------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        plan = self.spec.plan(self.scheduler) if self.spec is not None else None
        lookahead = plan.lookahead if plan is not None else 0
        sched = self.scheduler.schedule(lookahead=lookahead)
        if self.spec is not None:
            for seq in sched.preempted:
                self.spec.on_preempt(seq)
        if sched.empty:
            return []
        trees = self.spec.propose(plan, sched.decodes) if self.spec is not None else {}
        try:
            feeds, kinds, result, forward_seconds = self._forward(sched, trees)
        except KVOwnershipError as exc:
            if not trees:
                raise
            # A speculative write would have touched pages it does not own: nothing was written
            # (ownership is checked before the forward). Redo the step without speculation.
            log.warning("KV ownership violation in a speculative step (%s): redoing it plainly", exc)
            self.spec.metrics.record_rejection("kv_cache_mismatch", plan.method, count=len(trees))
            trees = {}
            feeds, kinds, result, forward_seconds = self._forward(sched, trees)

        emitted: dict[str, list[int]] = {}
        plain_rows, plain_seqs = [], []
        tree_items = []
        for i, (kind, seq) in enumerate(kinds):
            if kind in ("decode", "prefill"):
                plain_rows.append(result.feed_logits(i))
                plain_seqs.append(seq)
            elif kind == "tree":
                tree_items.append((i, seq))
        if tree_items:
            self.spec.set_verify_seconds(forward_seconds)
            emitted.update(self.spec.verify(tree_items, trees, result))
        if plain_rows:
            tokens = sample_next_tokens(torch.cat(plain_rows), plain_seqs)
            for seq, tok in zip(plain_seqs, tokens):
                emitted[seq.request_id] = [tok]
        if self.spec is not None:
            self.spec.after_forward(kinds, feeds, result, forward_seconds)

        outputs = []
        now = time.monotonic()
        for kind, seq in kinds:
            new = emitted.get(seq.request_id)
            if new is None:
                continue  # a prompt chunk that produced no token yet
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            outputs.append(self._emit(seq, new))
        return outputs

    def _forward(self, sched, trees):
        feeds: list[Feed] = []
        kinds: list[tuple[str, Sequence]] = []
        for seq in sched.decodes:
            tree = trees.get(seq.request_id)
            if tree is None:
                feeds.append(Feed(seq.kv, [seq.last_token], seq.num_cached))
                kinds.append(("decode", seq))
            else:
                feeds.append(self.spec.tree_feed(seq, tree))
                kinds.append(("tree", seq))
        for seq, chunk in sched.prefills:
            start = seq.num_cached
            final = start + chunk == len(seq.token_ids)
            feeds.append(Feed(seq.kv, seq.token_ids[start:start + chunk], start,
                              logits=LAST_LOGITS if final else NO_LOGITS))
            kinds.append(("prefill" if final else "chunk", seq))
        t0 = time.perf_counter()
        result = self.runner.run(feeds, aux_layers=self.spec.aux_layers if self.spec is not None else ())
        return feeds, kinds, result, time.perf_counter() - t0

    def _emit(self, seq: Sequence, tokens: list[int]) -> RequestOutput:
        n_before = seq.num_output_tokens
        done = False
        for tok in tokens:
            if append_token(seq, tok, self.eos_ids, self.max_model_len):
                done = True
                break
        if self.spec is not None:
            self.spec.on_tokens(seq, len(tokens), seq.num_output_tokens - n_before)
        delta = seq.detokenizer.update(seq.output_token_ids)
        seq.output_text = seq.detokenizer.text
        if done:
            delta += seq.detokenizer.flush(seq.output_token_ids)
            seq.output_text = seq.detokenizer.text
        elif seq.params.stop:
            hit = find_stop_string(seq, seq.output_text, len(delta))
            if hit is not None:
                stop, idx = hit
                end = idx + (len(stop) if seq.params.include_stop_str_in_output else 0)
                delta = delta[: max(0, len(delta) - (len(seq.output_text) - end))]
                seq.output_text = seq.output_text[:end]
                seq.finish_reason, seq.stop_reason = "stop", stop
                done = True
        if done:
            self._finish(seq)
        return self._output(seq, new_text=delta, new_ids=seq.output_token_ids[n_before:])

    def _finish(self, seq: Sequence) -> None:
        if seq.status is not Status.FINISHED:
            self.scheduler.finish(seq)
            seq.metrics.finished_time = time.monotonic()
            if self.spec is not None:
                self.spec.on_finish(seq)
        self._requests.pop(seq.request_id, None)

    def _output(self, seq: Sequence, new_text: str = "", new_ids: list[int] | None = None) -> RequestOutput:
        comp = CompletionOutput(0, seq.output_text, list(seq.output_token_ids), seq.finish_reason, seq.stop_reason)
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [comp], seq.finished,
                             metrics=seq.metrics, new_text=new_text, new_token_ids=new_ids or [])

    def kv_usage(self) -> float:
        return self.pool.usage()


def _int_list(values: Any) -> list[int]:
    try:
        ids = [int(v) for v in values]
    except (TypeError, ValueError):
        raise RequestError("prompt_token_ids must be a list of integers") from None
    if any(isinstance(v, bool) or int(v) != v for v in values):
        raise RequestError("prompt_token_ids must be a list of integers")
    return ids
