"""The vLLM peer's worker: one vLLM engine in a process of the vLLM venv's Python, driven over JSON lines.

``hyspec bench --vllm-python PATH`` starts ``PATH -m hyspec.bench.vllm_worker`` (vLLM's CPU build pins its own
torch, so it lives in a venv of its own: ``scripts/vllm_venv.sh``, which installs hyspec there too).  One
worker holds one engine: vLLM's ``LLM`` registers its Prometheus metrics (the source of the acceptance
figures) in one registry per process, and a second engine would replace the first's.

Protocol: the worker reads one JSON object per line on stdin and answers one per line on the stdout it was
started with; everything else vLLM or its engine process print goes to stderr.  Every answer has ``"ok"``;
a failed request has ``"ok": false``, ``"error"`` and ``"kind"`` (``unavailable``: vLLM cannot run this
configuration here, e.g. a method whose package is missing; ``failed``: anything else).

* ``{"op": "load", "model", "dtype", "max_model_len", "memory_fraction", "seed", "speculative_config",
  "hyspec_options", "enable_prefix_caching"}``: build the engine (``hyspec_options``: the JSON for
  ``HYSPEC_VLLM_CONFIG``, read by hyspec's proposer in vLLM's engine process).  Answers the vLLM version.
* ``{"op": "pass", "waves": [[[ids...], ...], ...], "max_tokens", "temperature", "seeds"}``: one pass, one
  wave after another (a wave is one ``generate`` call).  Before it, untimed, the prefix cache is emptied and
  every drafter forgets the responses of earlier requests (as hyspec's passes do), so a pass never reuses an
  earlier pass's prompts or answers.  Answers the outputs, the pass's wall seconds, each request's time to
  first token and the speculative counters' change over the pass.
* ``{"op": "prefill", "prompts": [[ids...], ...]}``: each prompt alone, one token generated, prefix cache
  emptied before each: the wall seconds per prompt (prefill speed).
* ``{"op": "quit"}``: answers, then the engine shuts down and the process exits.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, TextIO

#: vLLM's speculative-decoding counters (vllm/v1/spec_decode/metrics.py), read from its Prometheus registry
SPEC_COUNTERS = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
#: what vLLM raises when a method's optional package is missing (suffix needs arctic-inference)
_UNAVAILABLE = (ImportError, ModuleNotFoundError)


def forget_between_passes(worker: Any) -> int:
    """Run in vLLM's worker (``collective_rpc``) between passes, when no request is in flight: the drafter forgets
    the responses of finished requests, so the next pass cannot copy answers it saw in an earlier one.  Both
    drafters below notice that a request left the batch only at their next ``propose``, so the requests they
    still hold as live (the previous pass's last wave) are dropped too, not cached.  Returns how many
    responses and requests it dropped."""
    drafter = getattr(getattr(worker, "model_runner", None), "drafter", None)
    dropped = 0
    cache = getattr(drafter, "suffix_cache", None)  # vLLM's suffix method (arctic_inference's SuffixDecodingCache)
    if cache is not None:
        for request_id in list(cache.active_requests):
            cache.stop_request(request_id)
        for request_id in list(cache.cached_requests):
            cache.evict_cached_response(request_id)
            dropped += 1
    store = getattr(drafter, "cache", None)  # hyspec's proposer: the TokenStore of finished responses ...
    if store is not None and hasattr(store, "evict_oldest"):
        while len(store):
            store.evict_oldest()
            dropped += 1
    table = getattr(drafter, "requests", None)  # ... and its RequestTable of live requests (hyspec.vllm.requests)
    if table is not None and hasattr(table, "follow"):
        dropped += len(getattr(table, "live", {}) or {})
        drafter.requests = type(table)()
    return dropped


def spec_counters(llm: Any) -> dict[str, Any]:
    """vLLM's speculative counters now, summed over label sets (one engine per process: one set)."""
    out: dict[str, Any] = {name: 0 for name in SPEC_COUNTERS.values()}
    out["accepted_per_position"] = []
    for metric in llm.get_metrics():
        if metric.name in SPEC_COUNTERS:
            out[SPEC_COUNTERS[metric.name]] += int(metric.value)
        elif metric.name == PER_POSITION:
            values = list(metric.values)
            mine = out["accepted_per_position"]
            mine += [0] * (len(values) - len(mine))
            for i, v in enumerate(values):
                mine[i] += int(v)
    return out


def counters_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    out = {k: after[k] - before[k] for k in SPEC_COUNTERS.values()}
    pos_before = list(before["accepted_per_position"])
    pos_before += [0] * (len(after["accepted_per_position"]) - len(pos_before))
    out["accepted_per_position"] = [a - b for a, b in zip(after["accepted_per_position"], pos_before)]
    return out


class Engine:
    """One vLLM ``LLM`` and the requests of the protocol."""

    def __init__(self, job: dict[str, Any]):
        options = job.get("hyspec_options")
        if options is not None:  # read once by hyspec's proposer, in the engine process vLLM starts now
            path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"hyspec-vllm-options-{os.getpid()}.json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(options, f)
            os.environ["HYSPEC_VLLM_CONFIG"] = path
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        self.SamplingParams, self.TokensPrompt = SamplingParams, TokensPrompt
        self.llm = LLM(model=job["model"], dtype=job.get("dtype", "float32"),
                       max_model_len=job["max_model_len"], gpu_memory_utilization=job["memory_fraction"],
                       seed=job.get("seed", 0), speculative_config=job.get("speculative_config"),
                       enable_prefix_caching=job.get("enable_prefix_caching", True),
                       disable_log_stats=False)  # the spec counters and TTFTs come from the stats
        self.speculative = job.get("speculative_config") is not None

    def _forget(self) -> None:
        self.llm.reset_prefix_cache()
        if self.speculative:
            self.llm.collective_rpc(forget_between_passes)

    def run_pass(self, job: dict[str, Any]) -> dict[str, Any]:
        temperature, seeds = float(job.get("temperature", 0.0)), job.get("seeds")
        self._forget()
        before = spec_counters(self.llm) if self.speculative else None
        outputs: list[list[int]] = []
        ttfts: list[float] = []
        index = 0
        start = time.perf_counter()
        for wave in job["waves"]:
            params = [self.SamplingParams(temperature=temperature, max_tokens=job["max_tokens"], ignore_eos=True,
                                          seed=None if seeds is None else seeds[index + i]) for i in range(len(wave))]
            prompts = [self.TokensPrompt(prompt_token_ids=list(p)) for p in wave]
            for out in self.llm.generate(prompts, params, use_tqdm=False):
                outputs.append(list(out.outputs[0].token_ids))
                latency = getattr(out.metrics, "first_token_latency", None)
                if latency:
                    ttfts.append(float(latency))
            index += len(wave)
        seconds = time.perf_counter() - start
        spec = counters_delta(before, spec_counters(self.llm)) if before is not None else None
        return {"ok": True, "outputs": outputs, "seconds": seconds, "ttfts": ttfts, "spec": spec}

    def prefill(self, job: dict[str, Any]) -> dict[str, Any]:
        params = self.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
        seconds = []
        for prompt in job["prompts"]:
            self._forget()
            start = time.perf_counter()
            self.llm.generate([self.TokensPrompt(prompt_token_ids=list(prompt))], [params], use_tqdm=False)
            seconds.append(time.perf_counter() - start)
        return {"ok": True, "seconds": seconds}


def _peak_rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def serve(requests: TextIO, answers: TextIO) -> int:
    engine: Engine | None = None

    def answer(doc: dict[str, Any]) -> None:
        answers.write(json.dumps(doc) + "\n")
        answers.flush()

    for line in requests:
        if not line.strip():
            continue
        job = json.loads(line)
        op = job.get("op")
        try:
            if op == "load":
                if engine is not None:
                    raise ValueError("this worker already holds an engine (one per process)")
                import vllm

                start = time.perf_counter()
                engine = Engine(job)
                answer({"ok": True, "vllm_version": vllm.__version__, "load_seconds": time.perf_counter() - start})
            elif op in ("pass", "prefill"):
                if engine is None:
                    raise ValueError(f"{op!r} before 'load'")
                doc = engine.run_pass(job) if op == "pass" else engine.prefill(job)
                doc["max_rss_bytes"] = _peak_rss_bytes()
                answer(doc)
            elif op == "quit":
                answer({"ok": True})
                return 0
            else:
                raise ValueError(f"unknown op {op!r}")
        except _UNAVAILABLE as exc:
            answer({"ok": False, "kind": "unavailable", "error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:  # the peer's row says what vLLM said
            answer({"ok": False, "kind": "failed", "error": f"{type(exc).__name__}: {exc}"})
    return 0


def main() -> int:
    # The protocol keeps the stdout we were given; vLLM's logs (and its engine process, which inherits fd 1)
    # go to stderr, where the bench collects them into a log file.
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # forget_between_passes travels to vLLM's worker by collective_rpc, which pickles callables only when allowed
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    return serve(sys.stdin, protocol)


if __name__ == "__main__":
    sys.exit(main())
