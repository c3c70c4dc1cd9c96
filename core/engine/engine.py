"""The engine: requests in, one scheduled step at a time, outputs out.

One step, in :meth:`LLMEngine.step`, is five stages:

1. schedule -- the speculation strategy plans the step (method, draft budget),
   then the scheduler batches prefill chunks and decodes (continuous
   batching) and reserves KV for each decode's draft lookahead;
2. draft -- the strategy drafts a tree per decoding sequence
   (:mod:`hyspec.spec.decoder`; none for plain decoding);
3. run -- one packed target forward over every prefill chunk, decode token and
   draft tree (:class:`~hyspec.seam.forward.ModelRunner`);
4. accept -- plain rows are sampled (:mod:`hyspec.engine.sampler`), trees are
   verified losslessly and their accepted KV committed (the strategy), and the
   strategy observes the step (hidden states to drafters, cost model);
5. emit -- tokens are appended through the shared stopping rules, text is
   detokenized, finished requests' KV is freed.

The strategy is a :class:`~hyspec.spec.strategy.Speculation`, held
unconditionally: :class:`~hyspec.spec.strategy.NoSpeculation` without a
speculative config, so the step has no special case for plain decoding.
"""
from __future__ import annotations

import itertools
import json
import logging
import time
from pathlib import Path
from typing import Any

import torch

from hyspec.backends import registry as backend_registry
from hyspec.engine.controls import build_processors
from hyspec.engine.logprobs import LOGPROBS_MODES, PROCESSED, RAW
from hyspec.engine.outputs import CompletionOutput, RequestOutput
from hyspec.engine.parallel_sampling import fork_waiting_samples
from hyspec.engine.sampler import apply_controls, sample_next_tokens
from hyspec.engine.sampling_params import SamplingParams
from hyspec.engine.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from hyspec.engine.sequence import Sequence, Status
from hyspec.engine.step_graphs import StepGraphs, batch_buckets
from hyspec.engine.step_logprobs import record_prompt_logprobs, score_tokens
from hyspec.engine.stopping import append_token, find_stop_string
from hyspec.errors import ConfigError, KVOwnershipError, RequestError
from hyspec.kv.fragmentation import FragmentationMonitor
from hyspec.kv.pool import KVPool
from hyspec.kv.prefix_cache import PrefixCache
from hyspec.kv.sequence_kv import SequenceKV
from hyspec.model.config import ModelConfig
from hyspec.model.gguf_checkpoint import is_gguf
from hyspec.model.hub import looks_like_model_id, resolve_model
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import IncrementalDetokenizer, Tokenizer
from hyspec.seam.forward import ALL_LOGITS, LAST_LOGITS, NO_LOGITS, Feed, ModelRunner
from hyspec.seam.processors import apply_processors
from hyspec.seam.step import RowKind, StepRow, TargetRun
from hyspec.seam.target import TargetContext
from hyspec.seam.tree import DraftTree
from hyspec.spec.decoder import SpecDecoder
from hyspec.spec.strategy import Accepted, Drafts, NoSpeculation, Speculation

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
        block_size: int | None = None,
        memory_fraction: float = 0.8,
        kv_cache_bytes: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 1024,
        speculative_config: dict | str | None = None,
        tokenizer: str | Path | None = None,
        quantization: str | None = None,
        max_logprobs: int = 20,
        logprobs_mode: str = RAW,
        skip_tokenizer_init: bool = False,
        fragmentation_threshold: float = 1.2,
        fragmentation_window_s: float = 300.0,
        enable_prefix_caching: bool = False,
        enforce_eager: bool = False,
        cuda_graph_sizes: list[int] | None = None,
        disable_sliding_window: bool = False,
    ):
        # looked up on the module at each call: conformance and tests install a backend by replacing get_backend
        self.backend = backend_registry.get_backend(None if backend in (None, "auto") else backend)
        self.device = self.backend.device
        path = resolve_model(model)  # a path, or a Hub id's snapshot in the local Hugging Face cache
        self.model_path = path
        #: the Hub id the model was named by (served under that name, as vLLM does); None for a path
        self.model_id = str(model) if looks_like_model_id(model) else None
        cfg = ModelConfig.from_pretrained(path)  # first: it names a missing directory plainly
        if logprobs_mode not in LOGPROBS_MODES:
            raise ConfigError("logprobs_mode", f"must be one of {', '.join(LOGPROBS_MODES)}, got {logprobs_mode!r}")
        if isinstance(max_logprobs, bool) or not isinstance(max_logprobs, int) or max_logprobs < 0:
            raise ConfigError("max_logprobs", f"must be an integer >= 0, got {max_logprobs!r}")
        self.max_logprobs = max_logprobs
        self.logprobs_mode = logprobs_mode
        if block_size is None:
            block_size = self.backend.default_block_size()
        if isinstance(block_size, bool) or not isinstance(block_size, int) or not 1 <= block_size <= 4096:
            raise ConfigError("block_size", f"must be an integer in [1, 4096] (KV tokens per page), got {block_size!r}")
        self.block_size = block_size
        # tokenizer: a directory with tokenizer.json, for a GGUF file that carries no vocabulary (vLLM's argument);
        # skip_tokenizer_init: token ids in and out only (vLLM's flag): no text, no stop strings, no chat
        self.tokenizer = None if skip_tokenizer_init else Tokenizer(path if tokenizer is None else tokenizer)
        window = cfg.configured_sliding_window if disable_sliding_window else None
        if max_model_len is None:
            max_model_len = cfg.max_position_embeddings
            if window is not None:  # vLLM 0.32 (config/model.py, _get_and_verify_max_len): capped to the window
                max_model_len = min(max_model_len, window)
        elif window is not None and max_model_len > window:
            raise ConfigError("max_model_len", f"{max_model_len} exceeds the model's sliding_window ({window}); with "
                                               "disable_sliding_window every layer attends fully, so sequences are "
                                               "capped to the window, as vLLM does")
        if not 1 < max_model_len:
            raise ConfigError("max_model_len", f"must be at least 2, got {max_model_len}")
        if max_model_len > cfg.max_position_embeddings and cfg.rope.rope_type == "default":
            raise ConfigError("max_model_len", f"{max_model_len} exceeds the model's max_position_embeddings "
                                               f"({cfg.max_position_embeddings}) and it has no RoPE scaling")
        self.max_model_len = max_model_len
        # quantization: None keeps a GGUF's Q4 / Q8 codes where the backend has kernels (quantize_model.py),
        # and "auto" then means the activation dtype the backend computes those codes in best
        if dtype in (None, "auto") and quantization != "none" and is_gguf(path):
            dtype = self.backend.quantized_activation_dtype() or dtype
        self.model = load_model(path, dtype=dtype, device=self.device, ops=self.backend.ops,
                                max_positions=max_model_len + 64,  # + room for draft positions past the end
                                context_length=max_model_len,  # fixes longrope's factor set (model/rope.py)
                                quantization=quantization, backend=self.backend,
                                disable_sliding_window=disable_sliding_window)
        self.quantization = self.model.quantization
        self.model = self.backend.optimize_model(self.model)
        self.config = self.model.config
        self.dtype = self.model.embed_tokens.weight.dtype
        if self.tokenizer is not None and self.tokenizer.vocab_size > self.config.vocab_size:
            raise ConfigError("model", f"tokenizer has {self.tokenizer.vocab_size} tokens but the model only "
                                       f"{self.config.vocab_size} embeddings")
        self.eos_ids = frozenset(self._eos_ids(path))

        page_bytes = KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                           self.dtype, block_size)
        budget = self.backend.kv_cache_budget_bytes(memory_fraction, kv_cache_bytes)
        self.pool = KVPool.for_budget(budget, page_bytes, self.device)
        self.pool.block_size_rule = self.backend.block_size_rule()
        self.layout = self.pool.register("target", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim,
                                         self.dtype, block_size)
        capacity = self.pool.num_pages * self.layout.block_size
        if capacity < max_model_len:
            raise ConfigError("kv_cache_bytes" if self.device.type == "cpu" else "memory_fraction",
                              f"the KV pool holds {capacity} tokens, less than one max_model_len sequence "
                              f"({max_model_len}); give the cache more memory or lower max_model_len")
        self._graphs_for = self._graph_factory(enforce_eager, cuda_graph_sizes, max_num_seqs)
        self.runner = ModelRunner(self.model, self.layout, self.device,
                                  graphs=self._graphs_for(self.model, self.layout) if self._graphs_for else None)
        self.fragmentation = FragmentationMonitor(self.pool, fragmentation_threshold, fragmentation_window_s)
        self.scheduler = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len))
        if not isinstance(enable_prefix_caching, bool):
            raise ConfigError("enable_prefix_caching", f"must be true or false, got {enable_prefix_caching!r}")
        self.prefix_cache: PrefixCache | None = None
        if enable_prefix_caching:
            self.prefix_cache = PrefixCache(self.pool, self.layout)
            self.scheduler.prefix_lookup = self._adopt_cached_prefix
            self.scheduler.prefix_block_size = self.layout.block_size
        self._ids = itertools.count()
        self._requests: dict[str, Sequence] = {}
        #: What drafters may see of the target (they never get the engine itself).
        self.target = TargetContext(
            backend=self.backend, pool=self.pool, vocab_size=self.config.vocab_size, max_model_len=max_model_len,
            dtype=self.dtype, model=self.model, model_path=path, tokenizer=self.tokenizer, layout=self.layout,
            runner=self.runner, max_num_seqs=max_num_seqs, step_graphs=self._graphs_for)
        self.spec: Speculation = NoSpeculation()
        if speculative_config is not None:
            self.spec = SpecDecoder.create(self.target, speculative_config)
        log.info("engine ready: %s on %s, %d KV pages of %d tokens", path.name, self.backend.name,
                 self.pool.num_pages, block_size)

    def _graph_factory(self, enforce_eager: bool, sizes: list[int] | None, max_num_seqs: int):
        """``(model, layout) -> StepGraphs`` where the backend records graphs (CUDA) and the user did not ask for
        eager execution (vLLM's ``enforce_eager``; ``cuda_graph_sizes``: its batch sizes to capture); None
        otherwise.  The target and a draft model each get theirs (one capturer, so one memory pool)."""
        if not isinstance(enforce_eager, bool):
            raise ConfigError("enforce_eager", f"must be true or false, got {enforce_eager!r}")
        try:
            buckets = batch_buckets(max_num_seqs, sizes)
        except ValueError as e:
            raise ConfigError("cuda_graph_sizes", str(e)) from None
        capturer = None if enforce_eager else self.backend.graph_capturer()
        if capturer is None:
            return None

        def graphs_for(model, layout) -> StepGraphs:
            return StepGraphs(model, list(layout.caches), capturer, block_size=layout.block_size,
                              max_len=model.max_positions, batch_sizes=buckets, device=self.device)
        return graphs_for

    def release_memory(self) -> None:
        """Free the KV pool and the captured graphs now and hand cached device memory back (LLM.close)."""
        if self.runner.graphs is not None:
            self.runner.graphs.release()
        self.pool.release()
        self.backend.release_cached_memory()

    @property
    def graph_stats(self) -> dict | None:
        """Captures, replays and eager steps by reason; None when steps are not captured."""
        graphs = self.runner.graphs
        return None if graphs is None else graphs.stats.as_dict()

    def _eos_ids(self, path: Path) -> set[int]:
        ids = set(self.config.eos_token_ids)
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
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
                    request_id: str | None = None, share_prompt_with: str | None = None) -> Sequence:
        """Validate and queue a request; raises RequestError without disturbing other requests.

        One request is one completion: ``n`` / ``best_of`` fan out into one request per sample
        (:mod:`hyspec.engine.parallel_sampling`; ``LLM.generate`` and the server do it).  A sample
        names the request whose prompt it shares in ``share_prompt_with``: while that one has not
        finished its prefill, the sample waits and then continues from a fork of its KV, so the
        prompt is computed once.
        """
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise RequestError("params must be a hyspec.SamplingParams")
        if params.num_samples > 1:
            raise RequestError(f"n={params.n}, best_of={params.best_of}: LLMEngine.add_request runs one completion; "
                               "fan samples out with hyspec.engine.parallel_sampling (LLM.generate and the server do)")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(params, name)
            if k is not None and k > self.max_logprobs:
                raise RequestError(f"{name}={k} is above this engine's max_logprobs ({self.max_logprobs})")
        if self.tokenizer is None and (params.stop or (isinstance(prompt, str)) or
                                       (isinstance(prompt, dict) and "prompt_token_ids" not in prompt)):
            raise RequestError("the engine was started with skip_tokenizer_init: send prompt_token_ids, "
                               "and stop_token_ids rather than stop strings")
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
        processors = build_processors(params, ids, eos_ids=self.eos_ids, vocab_size=vocab,
                                      tokenizer=self.tokenizer, device=self.device)
        seq = Sequence(request_id, text, ids, params, SequenceKV(self.pool, self.layout))
        seq.processors = processors
        if self.tokenizer is not None:
            seq.detokenizer = IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens)
        self.spec.admit(seq)
        self._requests[request_id] = seq
        leader = self._requests.get(str(share_prompt_with)) if share_prompt_with is not None else None
        if leader is not None and leader.leader is None and leader.num_output_tokens == 0 \
                and leader.prompt_token_ids == ids:
            seq.leader = leader  # waits (outside the scheduler) for the leader's prefill: parallel_sampling.fork_waiting_samples
            leader.followers.append(seq)
        else:
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

    def num_pending_samples(self) -> int:
        """Samples waiting for their leader's prefill (queued, though not in the scheduler yet)."""
        return sum(len(s.followers) for s in self._requests.values())

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_unfinished_requests(self) -> int:
        return self.scheduler.num_unfinished + self.num_pending_samples()

    # -- stepping --------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        # 1. schedule: the plan sizes each decode's KV lookahead before the scheduler reserves pages
        plan = self.spec.plan(self.scheduler)
        scheduled = self.scheduler.schedule(lookahead=plan.lookahead)
        # 2. draft (the strategy also forgets what it held for preempted sequences)
        drafts = self.spec.draft(plan, scheduled)
        if scheduled.empty:
            return []
        # 3. run: one target forward over every row
        run, drafts = self._run_target(scheduled, drafts)
        # 4. accept: sample plain rows, verify trees; the strategy learns from the step
        tokens, logprobs = self._accept(run, drafts)
        # 5. emit; between steps, the pool's fragmentation is measured (and compacted if it persists)
        outputs = self._emit_step(run, tokens, logprobs)
        self.fragmentation.tick()
        return outputs

    def _run_target(self, scheduled: SchedulerOutput, drafts: Drafts) -> tuple[TargetRun, Drafts]:
        try:
            return self._forward(scheduled, drafts), drafts
        except KVOwnershipError as exc:
            if not drafts:
                raise
            # A speculative write would have touched pages it does not own: nothing was written
            # (ownership is checked before the forward). Redo the step without speculation.
            log.warning("KV ownership violation in a speculative step (%s): redoing it plainly", exc)
            drafts = self.spec.abandon(drafts, "kv_cache_mismatch")
            return self._forward(scheduled, drafts), drafts

    def _forward(self, scheduled: SchedulerOutput, drafts: Drafts) -> TargetRun:
        feeds: list[Feed] = []
        rows: list[StepRow] = []
        for seq in scheduled.decodes:
            tree = drafts.trees.get(seq.request_id)
            if tree is None:
                feeds.append(Feed(seq.kv, [seq.last_token], seq.num_cached))
                rows.append(StepRow(RowKind.DECODE, seq))
            else:
                feeds.append(tree_feed(seq, tree))
                rows.append(StepRow(RowKind.TREE, seq))
        forks: dict[str, list[Sequence]] = {}
        for seq, chunk in scheduled.prefills:
            start = seq.num_cached
            final = start + chunk == len(seq.token_ids)
            logits = ALL_LOGITS if seq.wants_prompt_logprobs else LAST_LOGITS if final else NO_LOGITS
            feeds.append(Feed(seq.kv, seq.token_ids[start:start + chunk], start, logits=logits))
            rows.append(StepRow(RowKind.PREFILL if final else RowKind.CHUNK, seq))
            if final and seq.followers:
                forks[seq.request_id] = list(seq.followers)
        t0 = time.perf_counter()
        result = self.runner.run(feeds, aux_layers=self.spec.aux_layers)
        seconds = time.perf_counter() - t0
        if self.prefix_cache is not None:
            for row in rows:
                if row.kind is RowKind.PREFILL:  # the prompt's KV is complete: its full pages can serve others
                    seq = row.seq
                    self.prefix_cache.insert(seq.token_ids[:min(seq.num_prompt_tokens, seq.num_cached)], seq.kv.pages)
        return TargetRun(feeds, rows, result, seconds, forks)

    # -- prefix caching --------------------------------------------------------------------------

    def _adopt_cached_prefix(self, seq: Sequence) -> None:
        """Admission of a sequence with no KV: adopt the cached pages its tokens start with (at least its last
        token is left to prefill, for its logits).  Not for requests that want prompt logprobs (the skipped
        rows would have none).  A drafter that learns from the target's hidden states gets them from the first
        uncached token on: it drafts from a shorter context, as after its cache was reclaimed."""
        if seq.wants_prompt_logprobs:
            return
        pages = self.prefix_cache.match(seq.token_ids, len(seq.token_ids) - 1)
        if pages:
            seq.kv.adopt(pages, len(pages) * self.layout.block_size)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (vLLM's ``reset_prefix_cache``); False when caching is off."""
        if self.prefix_cache is None:
            return False
        self.prefix_cache.reset()
        return True

    def _accept(self, run: TargetRun, drafts: Drafts) -> tuple[dict[str, list[int]], dict[str, list]]:
        """Tokens per request (one sampled for each plain row, the verified path + bonus for each tree),
        and the logprobs of those tokens for the requests that asked."""
        record_prompt_logprobs(run, self.logprobs_mode, self._token_text)
        fork_waiting_samples(run, self._requests, self.scheduler)
        plain = [i for i, row in enumerate(run.rows) if row.kind.samples_plainly]
        tokens: dict[str, list[int]] = {}
        scored: list[tuple[Sequence, torch.Tensor]] = []  # (seq, logits rows of its new tokens)
        if plain:
            seqs, rows = [], []
            for i in plain:  # a prefill's last row is its first token's; forked samples draw from it too
                seq, last = run.rows[i].seq, run.result.feed_logits(i)[-1:]
                for s in [seq, *run.forks.get(seq.request_id, ())]:
                    seqs.append(s)
                    rows.append(last)
            logits = torch.cat(rows)
            controlled = apply_controls(logits, seqs)  # the request's sampling controls, then its sampler
            sampled = sample_next_tokens(controlled, seqs, self.backend.ops)
            tokens.update((seq.request_id, [tok]) for seq, tok in zip(seqs, sampled))
            scoring = controlled if self.logprobs_mode == PROCESSED else logits
            scored += [(s, scoring[r:r + 1]) for r, s in enumerate(seqs) if s.logprobs is not None]
        accepted: Accepted = self.spec.accept(run, drafts)
        tokens.update(accepted.tokens)
        for i in run.indices(RowKind.TREE):
            seq = run.rows[i].seq
            if seq.logprobs is not None:  # emitted token k was verified against the row of kept node k
                kept = accepted.kept_rows[seq.request_id]
                rows = run.result.feed_logits(i)[torch.tensor(kept, device=self.device)]
                if seq.processors and self.logprobs_mode == PROCESSED:  # the law verification compared against
                    emitted = tokens[seq.request_id]
                    rows = rows.float()
                    apply_processors(seq.processors, [emitted[:k] for k in range(len(kept))], rows)
                scored.append((seq, rows))
        self.spec.observe(run, accepted)
        return tokens, score_tokens(scored, tokens, self.logprobs_mode, self._token_text)

    def _token_text(self, token_id: int) -> str | None:
        return None if self.tokenizer is None else self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _emit_step(self, run: TargetRun, tokens: dict[str, list[int]], logprobs: dict[str, list]
                   ) -> list[RequestOutput]:
        outputs = []
        now = time.monotonic()
        for row in run.rows:
            for seq in [row.seq, *run.forks.get(row.seq.request_id, ())]:
                new = tokens.get(seq.request_id)
                if new is None:
                    continue  # a prompt chunk that produced no token yet
                if seq.metrics.first_token_time is None:
                    seq.metrics.first_token_time = now
                outputs.append(self._emit(seq, new, logprobs.get(seq.request_id)))
        return outputs

    def _emit(self, seq: Sequence, tokens: list[int], logprobs: list | None = None) -> RequestOutput:
        n_before = seq.num_output_tokens
        done = False
        for j, tok in enumerate(tokens):
            stop = append_token(seq, tok, self.eos_ids, self.max_model_len)
            if seq.logprobs is not None and logprobs is not None:
                seq.logprobs.append(logprobs[j])
                seq.cumulative_logprob += logprobs[j][tok].logprob
            if stop:
                done = True
                break
        for processor in seq.processors:  # the committed output the next step's processors start from
            processor.commit(seq.output_token_ids[n_before:])
        if seq.detokenizer is None:  # skip_tokenizer_init: ids only
            delta = ""
        else:
            delta = seq.detokenizer.update(seq.output_token_ids)
            seq.output_text = seq.detokenizer.text
        if done and seq.detokenizer is not None:
            delta += seq.detokenizer.flush(seq.output_token_ids)
            seq.output_text = seq.detokenizer.text
        elif not done and seq.params.stop and seq.num_output_tokens > seq.params.min_tokens:
            # vLLM checks stop strings only once min_tokens are out (v1/engine/detokenizer.py)
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
        new_logprobs = seq.logprobs[n_before:] if seq.logprobs is not None else []
        return self._output(seq, new_text=delta, new_ids=seq.output_token_ids[n_before:], new_logprobs=new_logprobs)

    def _finish(self, seq: Sequence) -> None:
        if seq.status is not Status.FINISHED:
            self.scheduler.finish(seq)
            seq.metrics.finished_time = time.monotonic()
            self.spec.release(seq)
        self._requests.pop(seq.request_id, None)
        if seq.leader is not None:  # a sample that never started: its leader stops waiting for it
            seq.leader.followers.remove(seq)
            seq.leader = None
        if seq.followers:  # ended before its prefill did: the next sample prefills for the rest
            heir, *rest = seq.followers
            seq.followers = []
            heir.leader, heir.followers = None, rest
            for f in rest:
                f.leader = heir
            self.scheduler.add(heir)

    def _output(self, seq: Sequence, new_text: str = "", new_ids: list[int] | None = None,
                new_logprobs: list | None = None) -> RequestOutput:
        comp = CompletionOutput(0, seq.output_text, list(seq.output_token_ids), seq.finish_reason, seq.stop_reason,
                                logprobs=None if seq.logprobs is None else list(seq.logprobs),
                                cumulative_logprob=seq.cumulative_logprob)
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_token_ids, [comp], seq.finished,
                             metrics=seq.metrics, new_text=new_text, new_token_ids=new_ids or [],
                             prompt_logprobs=seq.prompt_logprobs, new_logprobs=new_logprobs or [])

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


def tree_feed(seq: Sequence, tree: DraftTree) -> Feed:
    """``seq``'s verification feed: the root and every draft node of ``tree``, each at its tree depth, attending
    through the ancestor mask (a chain attends causally: no mask)."""
    n = tree.num_nodes
    is_chain = bool((tree.parents == torch.arange(-1, n - 1)).all())
    return Feed(seq.kv, tree.tokens.tolist(), seq.num_cached, depths=tree.depths.tolist(),
                tree_mask=None if is_chain else tree.ancestor_mask(), logits=ALL_LOGITS)
