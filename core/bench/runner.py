"""One benchmark run: prompts, hyspec's methods and the transformers peers on the same weights, in one process.

Order: the copy bandwidth, hyspec plain decoding (the reference for speed-ups
and token identity), each speculative method (one engine per method, released
before the next loads), then the peers.  A method that cannot run here (no
drafter, not in this build, rejected by the backend) is a skipped row with the
reason; an error while a hyspec configuration runs is a failed row (and the
run does not pass); a peer that is missing or fails says so in its row.
"""
from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from hyspec import LLM, assets  # assets.default_model through the module: a test replaces it
from hyspec.backends.registry import get_backend
from hyspec.bench import ceiling, hyspec_runs  # through the modules: tests replace hyspec_runs.run_workload
from hyspec.bench.identity import (NOT_APPLICABLE, IdentityVerdict, LazyJudge, ReferenceLogits,
                                   TeacherForcedJudge, check_identity)
from hyspec.bench.machine import (PeakMemory, decode_weight_bytes, machine_info, measure_copy_bandwidth,
                                  unique_parameter_count)
from hyspec.bench.llamacpp_peer import LlamaCppPeer, llamacpp_missing, resolve_python
from hyspec.bench.measure import Measurement, Workload
from hyspec.bench.peers import HFModels, PeerUnavailable, transformers_missing
from hyspec.bench.prompts import CHAT, HUMANEVAL, build_prompt_set, chat_prompts, humaneval_prompts, read_prompt_file
from hyspec.bench.result import FAILED, HYSPEC, LLAMACPP, OK, SKIPPED, TRANSFORMERS, Document, Row
from hyspec.bench.settings import LLAMACPP_PEERS, PEERS, PLAIN, VLLM_PEERS, BenchSettings, bench_methods
from hyspec.bench.prefill import hyspec_prefill, llamacpp_prefill, long_prompt
from hyspec.bench.vllm_rows import VllmRows
from hyspec.bench.workloads import workload_requests
from hyspec.errors import HyspecError
from hyspec.model.config import ModelConfig
from hyspec.model.tokenizer import Tokenizer
from hyspec.spec.registry import drafter_methods


def resolve_drafters(settings: BenchSettings, model_is_default: bool) -> tuple[dict[str, Path], dict[str, str]]:
    """(method -> drafter dir, method -> why there is none) for every method with drafter weights.

    --drafter METHOD=DIR wins; otherwise the default model uses the drafters
    in assets/, and any other target has none (drafters are trained
    for one target).
    """
    found, missing = {}, {}
    for method in drafter_methods():
        if method in settings.drafters:
            path = settings.drafters[method]
            if (path / "config.json").is_file():
                found[method] = path
            else:
                missing[method] = f"--drafter {method}={path}: no config.json there"
        elif model_is_default:
            try:
                found[method] = assets.default_drafter(method)
            except HyspecError as exc:
                missing[method] = f"drafter missing: {exc}"
        else:
            missing[method] = f"no {method} drafter for this model: pass --drafter {method}=DIR"
    return found, missing


def _load_prompts(settings: BenchSettings, model: Path, max_tokens: int):
    if settings.workload is not None:
        return _load_workload(settings, model, max_tokens)
    chat = settings.prompts_file is not None and str(settings.prompts_file) == CHAT
    if not chat:  # a bad prompt file is reported before anything of the model is read
        texts = humaneval_prompts() if settings.prompts_file is None else read_prompt_file(settings.prompts_file)
        name = HUMANEVAL if settings.prompts_file is None else str(settings.prompts_file)
    cfg = ModelConfig.from_pretrained(model)
    tokenizer = Tokenizer(model)
    encode = tokenizer.encode
    if chat:
        texts, name = chat_prompts(tokenizer.apply_chat_template), CHAT
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731 (the template has them)
    return build_prompt_set(texts, name, encode, settings.num_prompts, cfg.max_position_embeddings - max_tokens), cfg


def _load_workload(settings: BenchSettings, model: Path, max_tokens: int):
    """``--workload``'s request stream, in its order (agentic repeats after their originals)."""
    cfg = ModelConfig.from_pretrained(model)
    tokenizer = Tokenizer(model)
    requests = workload_requests(settings.workload, tokenizer.apply_chat_template, settings.num_prompts)
    texts = [text for text, _ in requests]
    rendered = {text for text, templated in requests if templated}
    # a chat-template rendering already holds its special tokens; a raw prompt gets the tokenizer's own
    encode = lambda text: tokenizer.encode(text, add_special_tokens=text not in rendered)  # noqa: E731
    return build_prompt_set(texts, settings.workload, encode, settings.num_prompts,
                            cfg.max_position_embeddings - max_tokens), cfg


class BenchRunner:
    def __init__(self, settings: BenchSettings, command: list[str] | None = None, progress: bool = True,
                 checkpoint: Callable[[dict[str, Any]], None] | None = None):
        self.settings = settings
        self.command = list(command) if command is not None else ["hyspec", "bench"]
        self.show_progress = progress
        # called with the document so far (``"complete": false``) after every method and the peers, so a run
        # killed by a time limit or a crash keeps what it measured (a leased GPU's minutes are few)
        self.checkpoint = checkpoint

    def run(self) -> dict[str, Any]:
        from tqdm.auto import tqdm


        s = self.settings
        model = Path(s.model) if s.model is not None else assets.default_model()
        try:
            is_default = s.model is None or model.resolve() == assets.default_model().resolve()
        except HyspecError:
            is_default = False
        prompts, cfg = _load_prompts(s, model, s.max_tokens)
        drafters, missing = resolve_drafters(s, is_default)
        backend = get_backend(None if s.backend in (None, "auto") else s.backend)
        self.peak = PeakMemory(backend.device)
        methods = s.methods or bench_methods()
        workloads = [Workload.build(prompts.token_ids, bs, t, s.max_tokens, s.seed)
                     for bs in s.batch_sizes for t in s.temperatures]
        self.bar = tqdm(total=(len(methods) + len(s.ceiling) + len(s.peers)) * len(workloads), desc="hyspec bench",
                        unit="config",
                        disable=not self.show_progress, file=sys.stderr)
        try:
            self.bar.set_postfix_str("copy bandwidth")
            bandwidth = measure_copy_bandwidth(s.bandwidth_bytes, backend.device)
            if s.interleave:
                rows, reference, model_info, judge, pending = self._interleaved(model, methods, workloads, drafters,
                                                                                missing)
            else:
                rows, reference, model_info, judge = self._plain(model, workloads)
                pending = None
            dtype = model_info.pop("_dtype")
            model_info.update(path=str(model), name=model.name, embedded_default=is_default,
                              max_model_len=cfg.max_position_embeddings)
            bandwidth_doc = {"copy": bandwidth, "decode_weight_bytes": model_info["decode_weight_bytes"],
                             "plain_limit_tokens_per_s_bs1": bandwidth["bytes_per_s"] / model_info["decode_weight_bytes"]}

            def doc(rows: list[Row], complete: bool) -> dict[str, Any]:
                return Document(
                    command=self.command, machine=machine_info(backend), model=model_info,
                    dataset=prompts.summary(), settings=s.to_dict(), bandwidth=bandwidth_doc,
                    drafters={m: {"path": str(drafters[m]) if m in drafters else None, "reason": missing.get(m)}
                              for m in drafter_methods()},
                    memory_method=self.peak.read().method, rows=rows, complete=complete,
                    prefill=prefill_doc).to_dict()

            prefill_doc = None
            self._save(doc, rows)
            logits = ReferenceLogits(model, dtype, backend, s.quantization)  # the engine's kernels and weights
            self.judge = judge
            loaded = dict(drafters)
            for method in methods if pending is None else ():
                if method == PLAIN:
                    continue
                rows += self._method(model, method, workloads, loaded, missing, reference, logits, dtype)
                self._save(doc, rows)
            for method, results in (pending or {}).items():  # the interleaved run's methods, judged now
                rows += [self._judged(method, w, m, reference, logits, dtype) for w, m in results]
            if pending:
                self._save(doc, rows)
            for k in s.ceiling:
                rows += self._ceiling(model, k, workloads, reference, logits, dtype)
                self._save(doc, rows)
            rows += self._peers(model, workloads, drafters.get("draft_model"), reference, logits, dtype,
                                backend.device)
            prompt = None if s.prefill_tokens is None else long_prompt(prompts.token_ids, s.prefill_tokens)
            if prompt is not None:
                self._tick("hyspec plain: prefill")
                prefill_doc = {"prompt_tokens": len(prompt), "repeats": s.repeats,
                               "engines": [hyspec_prefill(model, s, prompt, s.repeats)]}
                if "llamacpp" in s.peers:
                    prefill_doc["engines"] += self._llamacpp_prefill(model, prompt)
            if any(p in VLLM_PEERS for p in s.peers):
                self._save(doc, rows)
                vllm = VllmRows(s, model, workloads, lambda w, out: self._agreement(w, out, reference, logits, dtype),
                                self._tick, self.bar.update, prompt,
                                checkpoint=lambda so_far: self._save(doc, rows + so_far))
                rows += vllm.run(s.peers)
                if prefill_doc is not None and vllm.prefill is not None:
                    prefill_doc["engines"].append(vllm.prefill)
                if vllm.info:  # which vLLM, on which weights: the document's model section says
                    model_info["vllm"] = vllm.info
        finally:
            self.bar.close()
        return doc(rows, True)

    def _save(self, doc: Callable[[list[Row], bool], dict[str, Any]], rows: list[Row]) -> None:
        if self.checkpoint is not None:
            self.checkpoint(doc(list(rows), False))

    # -- steps -----------------------------------------------------------------------------------

    def _tick(self, label: str) -> None:
        self.bar.set_postfix_str(label, refresh=False)

    def _skip(self, engine: str, method: str, workloads: list[Workload], reason: str) -> list[Row]:
        rows = [Row(engine, method, w.batch_size, w.temperature, SKIPPED, reason) for w in workloads]
        self.bar.update(len(workloads))
        return rows

    @staticmethod
    def _model_info(engine) -> dict[str, Any]:
        quant = engine.quantization
        return {"dtype": str(engine.dtype).replace("torch.", ""), "_dtype": engine.dtype,
                "quantization": None if quant is None else {**quant.to_dict(), "summary": quant.summary()},
                "parameters": unique_parameter_count(engine.model),
                "decode_weight_bytes": decode_weight_bytes(engine.model)}

    @staticmethod
    def _plain_row(w: Workload, m: Measurement) -> Row:
        identity = IdentityVerdict(NOT_APPLICABLE) if w.temperature else None
        return Row(HYSPEC, PLAIN, w.batch_size, w.temperature, OK, measurement=m, identity=identity)

    def _plain(self, model: Path, workloads: list[Workload]):
        self._tick("hyspec plain: loading")
        llm = hyspec_runs.build_llm(model, self.settings, None)  # no reference without it: errors propagate
        info = self._model_info(llm.engine)
        rows, reference = [], {}
        for w in workloads:
            self._tick(f"hyspec plain bs {w.batch_size} T {w.temperature:g}")
            m = hyspec_runs.run_workload(llm, w, self.settings.repeats, self.peak,
                                         self.settings.batching == "continuous")
            reference[w.key()] = m.outputs[0]
            rows.append(self._plain_row(w, m))
            self.bar.update(1)
        hyspec_runs.close_llm(llm)
        del llm
        gc.collect()
        return rows, reference, info, self._judge(model, workloads, reference)

    def _start(self, model: Path, method: str, workloads: list[Workload], loaded: dict[str, Path],
               missing: Mapping[str, str]) -> tuple[Any, list[Row]]:
        """``method``'s engine, or no engine and the rows that say why it did not start."""
        if method in drafter_methods() and method not in loaded:
            return None, self._skip(HYSPEC, method, workloads, missing[method])
        self._tick(f"hyspec {method}: loading")
        try:
            config = hyspec_runs.speculative_config(method, self.settings, loaded)
            return hyspec_runs.build_llm(model, self.settings, config), []
        except HyspecError as exc:  # not in this build, rejected by the backend, unreadable drafter, bad extra
            loaded.pop(method, None)  # the hybrid leaves it out
            return None, self._skip(HYSPEC, method, workloads, f"not available here: {exc}")
        except Exception as exc:  # a bug: reported, and the run does not pass
            loaded.pop(method, None)
            self.bar.update(len(workloads))
            reason = f"engine start failed: {type(exc).__name__}: {exc}"
            return None, [Row(HYSPEC, method, w.batch_size, w.temperature, FAILED, reason) for w in workloads]

    def _interleaved(self, model: Path, methods: Sequence[str], workloads: list[Workload],
                     drafters: Mapping[str, Path], missing: Mapping[str, str]):
        """``--interleave``: every engine loaded at once; per workload, their timed passes in turn.

        Returns the plain rows, the reference, the model info, the judge and, per method, the
        (workload, Measurement or the exception that stopped it) pairs, judged by the caller; a method
        that did not start has its rows there already (skipped or failed)."""
        s = self.settings
        self._tick("hyspec plain: loading")
        engines = {PLAIN: hyspec_runs.build_llm(model, s, None)}  # no reference without it: errors propagate
        info = self._model_info(engines[PLAIN].engine)
        loaded = dict(drafters)
        pending: dict[str, list[tuple[Workload, Any]]] = {}
        try:
            for method in methods:
                if method == PLAIN:
                    continue
                llm, rows = self._start(model, method, workloads, loaded, missing)
                if llm is None:
                    pending[method] = [(w, row) for w, row in zip(workloads, rows)]
                else:
                    engines[method] = llm
            results: dict[str, list[tuple[Workload, Any]]] = {m: [] for m in engines}
            for w in workloads:
                self._tick(f"hyspec, interleaved, bs {w.batch_size} T {w.temperature:g}")
                runners: dict[str, Any] = {}
                for method, llm in engines.items():
                    try:
                        runners[method] = hyspec_runs.PassRunner(llm, w, s.batching == "continuous")
                    except Exception as exc:
                        if method == PLAIN:
                            raise
                        results[method].append((w, exc))
                self.peak.reset()
                for _ in range(s.repeats):
                    for method in list(runners):
                        try:
                            runners[method].timed_pass()
                        except Exception as exc:
                            if method == PLAIN:
                                raise
                            del runners[method]
                            results[method].append((w, exc))
                memory = self.peak.read()
                for method, runner in runners.items():
                    m = runner.measurement(memory)
                    m.notes.append("interleaved: peak memory is every engine's together")
                    results[method].append((w, m))
                self.bar.update(len(engines))
        finally:
            for llm in engines.values():
                hyspec_runs.close_llm(llm)
            engines.clear()
            gc.collect()
        plain = results.pop(PLAIN)
        reference = {w.key(): m.outputs[0] for w, m in plain}
        plain_rows = [self._plain_row(w, m) for w, m in plain]
        pending.update(results)
        ordered = {m: pending[m] for m in methods if m in pending}
        return plain_rows, reference, info, self._judge(model, workloads, reference), ordered

    def _judge(self, model: Path, workloads: list[Workload], reference: dict) -> LazyJudge | None:
        """A plain engine with a small KV pool, to judge by teacher forcing every output that differs from plain
        decoding's (bench/identity.py); built at the first such output.

        Small, so it does not take the memory the engines under test are measured with: 1 GiB of KV on
        the CPU, a tenth of free memory on an accelerator.
        """
        greedy = [w for w in workloads if not w.temperature]
        if not greedy:
            return None

        def build() -> TeacherForcedJudge:
            self._tick("hyspec plain: measuring the near-tie rule")
            s = self.settings
            llm = LLM(str(model), backend=s.backend, dtype=s.dtype, quantization=s.quantization,
                      kv_cache_bytes=1 << 30, memory_fraction=0.1)
            widest = max(greedy, key=lambda w: w.batch_size)
            return TeacherForcedJudge(llm, widest.prompts, reference[widest.key()],
                                      chunk=s.num_speculative_tokens + 1)

        return LazyJudge(build)

    def _method(self, model: Path, method: str, workloads: list[Workload], loaded: dict[str, Path],
                missing: Mapping[str, str], reference: dict, logits: ReferenceLogits, dtype) -> list[Row]:
        llm, rows = self._start(model, method, workloads, loaded, missing)
        if llm is None:
            return rows
        return rows + self._timed_rows(llm, method, workloads, reference, logits, dtype)

    def _timed_rows(self, llm: Any, name: str, workloads: list[Workload], reference: dict, logits: ReferenceLogits,
                    dtype, before: Callable[[Workload], None] | None = None) -> list[Row]:
        """``llm`` timed over each workload (``before(w)`` first, untimed), judged against plain decoding; the
        engine is closed after."""
        rows = []
        for w in workloads:
            self._tick(f"hyspec {name} bs {w.batch_size} T {w.temperature:g}")
            if before is not None:
                before(w)
            try:
                m = hyspec_runs.run_workload(llm, w, self.settings.repeats, self.peak,
                                             self.settings.batching == "continuous")
            except Exception as exc:
                rows.append(Row(HYSPEC, name, w.batch_size, w.temperature, FAILED, f"{type(exc).__name__}: {exc}"))
            else:
                rows.append(Row(HYSPEC, name, w.batch_size, w.temperature, OK, measurement=m,
                                identity=self._identity(w, m.outputs, reference, logits, dtype)))
            self.bar.update(1)
        hyspec_runs.close_llm(llm)
        del llm
        gc.collect()
        return rows

    def _ceiling(self, model: Path, k: int, workloads: list[Workload], reference: dict, logits: ReferenceLogits,
                 dtype) -> list[Row]:
        """The oracle's rows at draft length ``k`` (hyspec.bench.ceiling): greedy workloads only, timed as a method
        is (after plain decoding, not interleaved with it), judged against plain decoding like every method."""
        name, answers = ceiling.row_name(k), ceiling.Answers()
        greedy = [w for w in workloads if not w.temperature]
        rows = self._skip(HYSPEC, name, [w for w in workloads if w.temperature],
                          "the oracle drafts plain decoding's greedy answers: temperature 0 only")
        self._tick(f"hyspec {name}: loading")
        try:
            with ceiling.oracle_registered(answers):
                llm = hyspec_runs.build_llm(model, self.settings, ceiling.speculative_config(k))
        except Exception as exc:  # a bug: reported, and the run does not pass
            self.bar.update(len(greedy))
            return rows + [Row(HYSPEC, name, w.batch_size, w.temperature, FAILED,
                               f"engine start failed: {type(exc).__name__}: {exc}") for w in greedy]
        return rows + self._timed_rows(llm, name, greedy, reference, logits, dtype,
                                       before=lambda w: answers.set(w.prompts, reference[w.key()]))

    def _judged(self, method: str, w: Workload, result: Any, reference: dict, logits, dtype) -> Row:
        """An interleaved method's row: its measurement judged against plain decoding, or why it has none."""
        if isinstance(result, Row):
            return result
        if isinstance(result, BaseException):
            return Row(HYSPEC, method, w.batch_size, w.temperature, FAILED, f"{type(result).__name__}: {result}")
        return Row(HYSPEC, method, w.batch_size, w.temperature, OK, measurement=result,
                   identity=self._identity(w, result.outputs, reference, logits, dtype))

    def _identity(self, w: Workload, outputs: list[list[list[int]]], reference: dict, logits, dtype) -> IdentityVerdict:
        """Every repeat's outputs against plain decoding's (temperature 0 only)."""
        if w.temperature:
            return IdentityVerdict(NOT_APPLICABLE)
        verdicts = [self.judge(w.prompts, reference[w.key()], out) for out in outputs]
        worst = max(verdicts, key=lambda v: (v.mismatches, v.near_ties))
        return worst

    def _peers(self, model: Path, workloads: list[Workload], assistant: Path | None, reference: dict,
               logits: ReferenceLogits, dtype, device) -> list[Row]:
        lc = [p for p in self.settings.peers if p in LLAMACPP_PEERS]
        return (self._hf_peers(model, workloads, assistant, reference, logits, dtype, device)
                + (self._llamacpp_peers(lc, model, workloads, reference, logits, dtype) if lc else []))

    @staticmethod
    def _agreement(w: Workload, outputs: list[list[int]], reference: dict, logits: ReferenceLogits, dtype):
        """Another engine's greedy outputs against hyspec plain decoding's (information, as for every peer)."""
        return None if w.temperature else check_identity(w.prompts, reference[w.key()], outputs, logits, dtype)

    def _llamacpp_prefill(self, model: Path, prompt: list[int]) -> list[dict[str, Any]]:
        """llama.cpp plain's prefill of the same prompt (nothing where the peer cannot run: its rows say why)."""
        import torch

        self._tick("llama.cpp: prefill")
        python = resolve_python(self.settings.llamacpp_python)
        if llamacpp_missing(python)[0] is not None:
            return []
        try:
            peer = LlamaCppPeer(python, model, torch.get_num_threads(), self.settings.num_speculative_tokens,
                                n_ctx=len(prompt) + 16)
            return [llamacpp_prefill(peer, prompt, self.settings.repeats)]
        except Exception as exc:  # the peer's own failure: the document says so instead of a figure
            return [{"engine": "llamacpp", "label": "llama.cpp plain", "error": f"{type(exc).__name__}: {exc}"}]

    def _llamacpp_peers(self, peers: list[str], model: Path, workloads: list[Workload], reference: dict,
                        logits: ReferenceLogits, dtype) -> list[Row]:
        """llama.cpp on the same GGUF, in a child process (hyspec.bench.llamacpp_peer)."""
        import torch

        self._tick("llama.cpp: checking")
        python = resolve_python(self.settings.llamacpp_python)
        reason, _ = llamacpp_missing(python)
        peer = None
        if reason is None:
            try:
                longest = max(len(p) for w in workloads for p in w.prompts)
                peer = LlamaCppPeer(python, model, torch.get_num_threads(), self.settings.num_speculative_tokens,
                                    n_ctx=longest + self.settings.max_tokens + 16)
            except PeerUnavailable as exc:
                reason = str(exc)
        if peer is None:
            return [row for p in peers for row in self._skip(LLAMACPP, p, workloads, reason)]
        rows = []
        for name in peers:
            for w in workloads:
                self._tick(f"{name} bs {w.batch_size} T {w.temperature:g}")
                try:
                    m = peer.run(name, w, self.settings.repeats)
                    agreement = check_identity(w.prompts, reference[w.key()], m.outputs[0], logits, dtype)
                except PeerUnavailable as exc:
                    rows.append(Row(LLAMACPP, name, w.batch_size, w.temperature, SKIPPED, str(exc)))
                except Exception as exc:  # the peer's own failure (a crash, a timeout): its column says so
                    rows.append(Row(LLAMACPP, name, w.batch_size, w.temperature, FAILED,
                                    f"llama.cpp failed: {type(exc).__name__}: {exc}"))
                else:
                    rows.append(Row(LLAMACPP, name, w.batch_size, w.temperature, OK, measurement=m,
                                    agreement=agreement))
                self.bar.update(1)
        return rows

    def _hf_peers(self, model: Path, workloads: list[Workload], assistant: Path | None, reference: dict,
                  logits: ReferenceLogits, dtype, device) -> list[Row]:
        peers = [p for p in self.settings.peers if p in PEERS]
        if not peers:
            return []
        reason = transformers_missing()
        if reason is None:
            self._tick("transformers: loading")
            _quiet_transformers()
            try:
                hf = HFModels(model, dtype, device, assistant, self.settings.num_speculative_tokens)
            except PeerUnavailable as exc:
                reason = str(exc)
        if reason is not None:
            return [row for peer in peers for row in self._skip(TRANSFORMERS, peer, workloads, reason)]
        rows = []
        for peer in peers:
            for w in workloads:
                self._tick(f"{peer} bs {w.batch_size} T {w.temperature:g}")
                try:
                    m = hf.run(peer, w, self.settings.repeats, self.peak)
                    agreement = (None if w.temperature else
                                 check_identity(w.prompts, reference[w.key()], m.outputs[0], logits, dtype))
                except PeerUnavailable as exc:
                    rows.append(Row(TRANSFORMERS, peer, w.batch_size, w.temperature, SKIPPED, str(exc)))
                except Exception as exc:  # the peer's own failure, or its identity check's: its column says so
                    rows.append(Row(TRANSFORMERS, peer, w.batch_size, w.temperature, FAILED,
                                    f"transformers failed: {type(exc).__name__}: {exc}"))
                else:
                    rows.append(Row(TRANSFORMERS, peer, w.batch_size, w.temperature, OK, measurement=m,
                                    agreement=agreement))
                self.bar.update(1)
        hf.close()
        return rows


def _quiet_transformers() -> None:
    """No weight-loading bars or deprecation chatter in the middle of the benchmark's own progress bar."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # an older or stripped transformers: its chatter is harmless
        pass


def run_bench(settings: BenchSettings, command: list[str] | None = None, progress: bool = True,
              checkpoint: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Run the benchmark and return the JSON document (see docs/bench.md); ``checkpoint`` gets partial ones."""
    return BenchRunner(settings, command, progress, checkpoint).run()
