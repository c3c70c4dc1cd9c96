"""Checks ``scripts/gpu_first_contact.sh`` runs on a GPU that the interpreter cannot: the sampler race, graph capture.

* ``race_check``: the race-prone verification cases (``cases.race_prone_verify_case``) through the fused
  rejection sampler, repeated, against the reference: any disagreement between warps shows up as a
  different node or token (or a hang, which the script's timeout catches);
* ``graph_capture_check``: one decode step of the Triton attention captured with ``torch.cuda.CUDAGraph``,
  replayed, compared bitwise with the eager call; then replayed after the sequences grew, which is what a
  serving graph must survive.  Twice: with the step's own launch (grid and partitions from host lengths:
  the grown replay is expected to be stale) and with ``static_bounds`` (fixed launch, device-side exits:
  expected to match);
* ``engine_graph_check``: ``LLM.generate`` on the tiny target, greedy, plain and ngram, once with the engine's
  captured steps (hyspec.engine.step_graphs) and once with ``enforce_eager=True``: the same tokens, the
  graphs' capture / replay counts and both wall times.  With ``device="cpu"`` (a dry run) the engine runs on
  conformance's interpreter backend, whose capturer replays by re-execution with the launch checks.
"""
from __future__ import annotations

import time
from typing import Any

import torch


def race_check(device: torch.device | str, repeats: int = 20) -> dict[str, Any]:
    from hyspec.cuda_ops.cases import race_prone_verify_case
    from hyspec.cuda_ops.verify import triton_rejection_sample
    from hyspec.ops.rejection import rejection_sample

    started = time.perf_counter()
    runs = mismatches = 0
    first: str | None = None
    for rep in range(repeats):
        for sampled in (False, True):
            target, trees, uniforms = race_prone_verify_case(rep, sampled, device, batch=64)
            ref_cur, ref_tok = rejection_sample(target, trees, uniforms)
            cur, tok = triton_rejection_sample(target, trees, uniforms)
            runs += 1
            if not (torch.equal(cur.cpu(), ref_cur.cpu()) and torch.equal(tok.cpu(), ref_tok.cpu())):
                mismatches += 1
                first = first or f"repeat {rep}, {'q rows' if sampled else 'one-hot'}"
    return {"runs": runs, "mismatches": mismatches, "first_mismatch": first, "passed": mismatches == 0,
            "seconds": round(time.perf_counter() - started, 2)}


def graph_capture_check(device: torch.device | str) -> dict[str, Any]:
    """Capture one decode step of the attention kernel twice: with the step's own launch and with
    ``static_bounds``; replay each for the captured step and after every sequence grew by one token."""
    return {mode: _capture_one(device, bounds) for mode, bounds in (("own_lengths", None),
                                                                      ("static_bounds", (1, 2048)))}


def _capture_one(device: torch.device | str, bounds: tuple[int, int] | None) -> dict[str, Any]:
    import dataclasses

    from hyspec.cuda_ops.attention import triton_paged_attention
    from hyspec.cuda_ops.cases import paged_attention_case

    out: dict[str, Any] = {}
    case = paged_attention_case([300, 1000, 70], [1, 1, 1], 32, 8, 128, 16, torch.bfloat16, device=device, seed=3)
    args = case.args()
    eager = triton_paged_attention(*args, static_bounds=bounds)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_paged_attention(*args, static_bounds=bounds)  # warm-up on the side stream (compiles)
    torch.cuda.current_stream().wait_stream(stream)
    try:
        with torch.cuda.graph(graph):
            captured = triton_paged_attention(*args, static_bounds=bounds)
    except Exception as exc:  # capture refused: a host sync or an allocation inside the step
        out.update(captured=False, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        return out
    graph.replay()
    torch.cuda.synchronize()
    out.update(captured=True, replay_equals_eager=bool(torch.equal(captured, eager)))
    # The next step: every sequence one token longer (KV already in the pool; lengths updated in place).
    grown = [n + 1 for n in case.meta.seq_lens_host]
    case.meta.seq_lens.copy_(torch.tensor(grown, dtype=case.meta.seq_lens.dtype))
    step2 = dataclasses.replace(case.meta, seq_lens_host=grown)
    expected2 = triton_paged_attention(case.q, case.k_cache, case.v_cache, step2, case.scale, static_bounds=bounds)
    graph.replay()
    torch.cuda.synchronize()
    out["replay_after_lengths_grew_equals_eager"] = bool(torch.equal(captured, expected2))
    return out


def engine_graph_check(device: str, max_tokens: int = 32) -> dict[str, Any]:
    import contextlib
    import tempfile

    from hyspec import LLM, SamplingParams
    from hyspec.conformance.targets import engine_backend, resolve
    from hyspec.conformance.tiny import make_tiny_target

    motif = [7, 19, 33, 41, 5]
    prompts = [motif * 4, [3, 9, 27, 81, 11, 12], motif * 2 + [60, 61], list(range(40, 70))]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
             "controller": {"enabled": False, "profile_at_startup": False}}
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_target(tmp)
        if device == "cpu":
            target = next(t for t in resolve("cuda") if getattr(t, "backend", None) is not None)
            backend_ctx = engine_backend(target)
        else:
            backend_ctx = contextlib.nullcontext("cuda")
        with backend_ctx as backend:
            for method, spec in (("plain", None), ("ngram", ngram)):
                runs = {}
                for eager in (True, False):
                    llm = LLM(str(model_dir), backend=backend, dtype="float32" if device == "cpu" else "bfloat16",
                              max_model_len=256, enforce_eager=eager, speculative_config=spec,
                              **({"kv_cache_bytes": 8 << 20} if device == "cpu" else {"memory_fraction": 0.2}))
                    try:
                        llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=4))  # warm-up/capture
                        started = time.perf_counter()
                        tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
                        runs[eager] = {"tokens": tokens, "seconds": round(time.perf_counter() - started, 3),
                                       "graphs": llm.engine.graph_stats}
                    finally:
                        llm.close()
                out[method] = {"identical": runs[True]["tokens"] == runs[False]["tokens"],
                               "eager_seconds": runs[True]["seconds"], "graph_seconds": runs[False]["seconds"],
                               "graph_stats": runs[False]["graphs"]}
    out["passed"] = all(v["identical"] and (v["graph_stats"] or {}).get("replays", 0) > 0
                        for k, v in out.items() if isinstance(v, dict))
    return out


__all__ = ["engine_graph_check", "graph_capture_check", "race_check"]
