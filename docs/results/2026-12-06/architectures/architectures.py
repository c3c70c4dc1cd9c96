"""Gemma 2, Gemma 3 (text) and Phi-3 against transformers, and every speculative method on each (issue 48).

Part 1, per architecture on two random tiny configs (tests/model/hf_fixtures.py, fp32 CPU): the largest
|logit difference| between hyspec and transformers (a) over an 11-token prompt + 64 paged greedy decode steps
against one full causal transformers forward, (b) on the dense (cache-free) path over a [2, 30] batch; and
whether the 65 greedy tokens equal transformers' ``generate``.

Part 2, per architecture: a GGUF round trip (tests/model/test_gguf_gemma_phi3.py's sources, written as llama.cpp's
converter writes them, F32 and Q8_0): max |logit difference| of the GGUF against the checkpoint it came from
(for Q8_0, the checkpoint holding the values the quantizer kept), and of the F32 file against transformers.

Part 2b, mixture-of-experts GGUFs (tests/model/test_gguf_moe.py's sources: Mixtral, Qwen2-MoE, Qwen3-MoE and a
Qwen3-MoE with dense layers, written as llama.cpp's converter writes them, F32 and Q8_0): the GGUF against the
checkpoint it came from over an 11-token prompt + 64 paged greedy steps (logits, tokens) and on the dense path,
and against transformers on the unrounded weights (for Q8_0 that is the quantization error).

Part 3, per architecture on one tiny target (vocab 320 with the conformance byte tokenizer, weights drawn at
std 0.08 so the greedy choices are not near-ties, Gemma 2 at its published caps 50 / 30): hyspec's
conformance check (hyspec.conformance.methods.check_method) for every method it lists, on the CPU backend:
batch 1 and a ragged batch token-identical to plain decoding, near-tie rate, KV pool clean.

Part 4, Phi-3 with longrope (tests/model/hf_fixtures.py LONGROPE_FAMILIES): per config and regime (a model
serving at most original_max_position_embeddings on a sequence within it: the short factor set; a model
serving more on a sequence past it: the long set, where transformers picks the same set), the paged and dense
|logit difference| against transformers and greedy equality; the GGUF round trip in both regimes
(tests/model/test_phi3_longrope.py's source); every method on the phi3_longrope identity target.

Part 5, Gemma in bf16 (``--gemma``, with parts 1 and 2 for the Gemma configs again, merged into an existing
``--out`` file): how far bf16 logits drift from fp32's, in units of the 4-ulp bound of
tests/model/test_numerics_vs_transformers.py, for hyspec, for hyspec with the norm arithmetic it had before
issue 48's fix (``1 + w`` and the normed activations rounded to bf16 before they multiply) and for transformers:
the mean and the largest over 64 sequences of 16 tokens on the dense path (the test
tests/model/test_gemma_phi3.py::test_bf16_drifts_from_fp32_no_more_than_transformers); the same over 20 random
12-token prompts + 4 decode steps through the paged KV cache, bf16 fed fp32's greedy tokens (teacher-forced, as
transformers' single forward is); and the single paged measurement of test_low_precision_loads_and_tracks_fp32
(prompt 3..14 + 4 greedy steps, bf16 choosing its own tokens, transformers teacher-forced).

Run from the repository root:  python docs/results/2026-12-06/architectures/architectures.py --out results.json
(``--quick``: part 1 on one config and part 3 on ngram only, to check the script works; ``--moe-gguf``: part 2b
alone, merged into an existing ``--out`` file; ``--longrope``: part 4 alone, merged likewise; ``--gemma``:
part 5, merged likewise.)
"""
from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))

from hyspec.model.loader import load_model  # noqa: E402
from tests.model.hf_fixtures import (FAMILIES, IDENTITY_TARGETS, LONGROPE_FAMILIES, identity_workspace,  # noqa: E402
                                     make_hf_model, make_identity_target)
from tests.model.paged_decode import greedy_paged  # noqa: E402

ARCHITECTURES = {"gemma2": ("gemma2", "gemma2_mqa"), "gemma3_text": ("gemma3", "gemma3_softcap"),
                 "phi3": ("phi3", "phi3_window")}


def logit_differences(family: str, root: Path) -> dict:
    path = root / family
    hf = make_hf_model(family, path)
    model = load_model(path, dtype="float32")
    prompt = torch.randint(3, 128, (11,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens, logits = greedy_paged(model, prompt, steps=64, block_size=16)
    ids = torch.randint(3, 128, (2, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, len(prompt) - 1:].float()
        gen = hf.generate(torch.tensor([prompt]), max_new_tokens=65, do_sample=False, eos_token_id=None,
                          pad_token_id=0)[0, len(prompt):].tolist()
        dense = (model.compute_logits(model.forward_dense(ids).hidden) - hf(ids).logits.float()).abs().max()
    cls, kwargs = FAMILIES[family]
    return {"family": family, "transformers_class": cls,
            "config": {k: v for k, v in kwargs.items() if k != "attn_implementation"},
            "paged_max_abs_logit_diff": float((logits - ref).abs().max()),
            "dense_max_abs_logit_diff": float(dense), "logit_scale": float(ref.abs().max()),
            "greedy_tokens_equal": tokens == gen, "greedy_tokens": len(tokens)}


def gguf_round_trip(arch: str, root: Path) -> dict:
    from tests.model.gguf_fixtures import write_gguf
    from tests.model.test_gguf_gemma_phi3 import IDS, _logits, _source

    out = {}
    for qtype in ("F32", "Q8_0"):
        src = root / f"gguf-{arch}-{qtype}"
        hf = _source(arch, src)
        gguf_file = write_gguf(src, root / f"{arch}-{qtype}.gguf", qtype, arch)
        ref = _logits(load_model(src, dtype="float32"))
        got = _logits(load_model(gguf_file, dtype="float32"))
        out[qtype] = {"gguf_vs_source_max_abs_logit_diff": float((got - ref).abs().max())}
        if qtype == "F32":
            with torch.no_grad():
                out[qtype]["gguf_vs_transformers_max_abs_logit_diff"] = float((got - hf(IDS).logits[0]).abs().max())
    return out


def moe_gguf_round_trip(name: str, root: Path) -> dict:
    from tests.model.gguf_moe_fixtures import write_moe_gguf
    from tests.model.test_gguf_moe import IDS, PROMPT, SOURCES, _logits, _source

    family, changes = SOURCES[name]
    out: dict = {"family": family, "changes": changes}
    for qtype in ("F32", "Q8_0"):
        src = root / f"gguf-{name}-{qtype}"
        hf = _source(name, src)
        gguf_file = write_moe_gguf(src, root / f"{name}-{qtype}.gguf", qtype)
        source, model = load_model(src, dtype="float32"), load_model(gguf_file, dtype="float32")
        ref_tokens, ref_logits = greedy_paged(source, PROMPT, steps=64)
        tokens, logits = greedy_paged(model, PROMPT, steps=64)
        got = _logits(model)
        with torch.no_grad():
            expected = hf(IDS).logits[0].float()
        out[qtype] = {"gguf_vs_source_paged_max_abs_logit_diff": float((logits - ref_logits).abs().max()),
                      "gguf_vs_source_dense_max_abs_logit_diff": float((got - _logits(source)).abs().max()),
                      "greedy_tokens_equal_to_source": tokens == ref_tokens, "greedy_tokens": len(tokens),
                      "gguf_vs_transformers_max_abs_logit_diff": float((got - expected).abs().max()),
                      "logit_scale": float(expected.abs().max())}
    return out


MOE_GGUF_SOURCES = ("mixtral", "qwen2_moe", "qwen3_moe", "qwen3_moe_mixed")


def longrope_regimes(family: str, root: Path) -> dict:
    from hyspec.model.rope import uses_long_factors
    from tests.model.hf_fixtures import LONGROPE_FAMILIES

    cls, kwargs = LONGROPE_FAMILIES[family]
    path = root / family
    hf = make_hf_model(family, path)
    orig, served = kwargs["original_max_position_embeddings"], kwargs["max_position_embeddings"]
    out: dict = {"family": family, "transformers_class": cls, "config": kwargs}
    for regime, context, prompt_len, steps in (("short", orig, 8, orig - 9), ("long", served, orig + 8, 24)):
        model = load_model(path, dtype="float32", max_positions=context)
        prompt = torch.randint(3, 128, (prompt_len,), generator=torch.Generator().manual_seed(1)).tolist()
        tokens, logits = greedy_paged(model, prompt, steps=steps, block_size=16)
        ids = torch.randint(3, 128, (2, prompt_len + steps), generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            ref = hf(torch.tensor([prompt + tokens[:-1]])).logits[0, prompt_len - 1:].float()
            gen = hf.generate(torch.tensor([prompt]), max_new_tokens=steps + 1, do_sample=False, eos_token_id=None,
                              pad_token_id=0)[0, prompt_len:].tolist()
            dense = (model.compute_logits(model.forward_dense(ids).hidden) - hf(ids).logits.float()).abs().max()
        out[regime] = {"served_context": context, "long_factors": uses_long_factors(model.config.rope, context),
                       "positions": prompt_len + steps, "paged_max_abs_logit_diff": float((logits - ref).abs().max()),
                       "dense_max_abs_logit_diff": float(dense), "logit_scale": float(ref.abs().max()),
                       "greedy_tokens_equal": tokens == gen, "greedy_tokens": len(tokens)}
    return out


def longrope_gguf_round_trip(root: Path) -> dict:
    from tests.model.gguf_fixtures import write_gguf
    from tests.model.test_phi3_longrope import ORIGINAL, _gguf_source

    ids = torch.arange(3, 318, 5)[None]  # 64 positions
    out: dict = {}
    for qtype in ("F32", "Q8_0"):
        src = root / f"gguf-longrope-{qtype}"
        hf = _gguf_source(src)
        gguf_file = write_gguf(src, root / f"longrope-{qtype}.gguf", qtype, "phi3")
        for regime, context, length in (("short", ORIGINAL, ORIGINAL), ("long", 128, 64)):
            ref, got = (load_model(p, dtype="float32", max_positions=context) for p in (src, gguf_file))
            with torch.no_grad():
                r, g = (m.compute_logits(m.forward_dense(ids[:, :length]).hidden)[0] for m in (ref, got))
                row = {"gguf_vs_source_max_abs_logit_diff": float((g - r).abs().max())}
                if qtype == "F32":
                    row["gguf_vs_transformers_max_abs_logit_diff"] = float(
                        (g - hf(ids[:, :length]).logits[0].float()).abs().max())
            out[f"{qtype}_{regime}"] = row
    return out


def identity_matrix(arch: str, root: Path, methods: list[str] | None) -> dict:
    from hyspec.conformance.methods import MethodSettings, Workspace, check_method, check_plain, methods_to_check
    from hyspec.conformance.targets import resolve
    family, changes = IDENTITY_TARGETS[arch]
    path = make_identity_target(arch, root / f"{family}_identity")
    target = resolve("cpu")[0]
    ws = identity_workspace(root / f"ws-{arch}", path)
    settings = MethodSettings()
    rows = {"plain": _row(check_plain(target, ws, settings))}
    for method in methods or methods_to_check():
        started = time.perf_counter()
        result = check_method(target, ws, method, settings)
        rows[method] = {**_row(result), "seconds": round(time.perf_counter() - started, 1)}
        print(f"  {arch} {method}: {result.status}", flush=True)
    return {"family": family, "changes": changes, "initializer_range": 0.08, "vocab_size": 320,
            "prompts": settings.num_prompts, "max_tokens": settings.max_tokens, "methods": rows}


def _bf16_drift(fp32: torch.Tensor, bf16: torch.Tensor) -> torch.Tensor:
    """Per sequence ([N, S, V] logits), the largest error in units of 4 bf16 ulps at each logit's magnitude."""
    a, b = fp32.float(), bf16.float()
    bound = 4 * torch.finfo(torch.bfloat16).eps * (a.abs() + a.pow(2).mean((1, 2), keepdim=True).sqrt())
    return ((a - b).abs() / bound).amax((1, 2))


def teacher_forced_paged(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), V] of a prefill then one-token decodes of ``tokens`` (not the model's own choices)."""
    from hyspec.kv.sequence_kv import SequenceKV
    from hyspec.seam.forward import LAST_LOGITS, Feed
    from tests.model.paged_decode import make_runner

    pool, layout, runner = make_runner(model)
    kv = SequenceKV(pool, layout)
    kv.reserve(len(prompt) + len(tokens) + 1)
    logits = [runner.run([Feed(kv, list(prompt), 0, logits=LAST_LOGITS)]).logits[0]]
    for token in tokens[:-1]:
        logits.append(runner.run([Feed(kv, [token], kv.num_tokens)]).logits[0])
    return torch.stack(logits)


def _with_bf16_norm_weights(model):
    """The arithmetic before issue 48's fix: ``1 + w`` rounded to bf16, so hyspec.model.gemma.gemma_rms_norm
    takes the op table's norm, which rounds the normed activations before the weight multiplies them."""
    for module in model.modules():
        if hasattr(module, "eps") and getattr(module, "weight", None) is not None:
            module.weight = torch.nn.Parameter(module.weight.to(torch.bfloat16), requires_grad=False)
    return model


def gemma_bf16_drift(family: str, root: Path) -> dict:
    path = root / f"bf16-{family}"
    hf = make_hf_model(family, path)
    hf16 = copy.deepcopy(hf).to(torch.bfloat16)
    fp32, bf16 = load_model(path, dtype="float32"), load_model(path, dtype="bfloat16")
    before = _with_bf16_norm_weights(load_model(path, dtype="bfloat16"))
    ids = torch.randint(3, 128, (64, 16), generator=torch.Generator().manual_seed(0))
    prompt = list(range(3, 15))  # test_low_precision_loads_and_tracks_fp32's
    tokens, a = greedy_paged(fp32, prompt, steps=4)
    with torch.no_grad():
        ref = fp32.compute_logits(fp32.forward_dense(ids).hidden)
        dense = {"hyspec": _bf16_drift(ref, bf16.compute_logits(bf16.forward_dense(ids).hidden)),
                 "hyspec_before_fix": _bf16_drift(ref, before.compute_logits(before.forward_dense(ids).hidden))}
        full = torch.tensor([prompt + tokens[:-1]])
        dense["transformers"] = _bf16_drift(hf(ids).logits, hf16(ids).logits)
        paged = {"transformers": float(_bf16_drift(hf(full).logits[:, len(prompt) - 1:],
                                                   hf16(full).logits[:, len(prompt) - 1:])[0])}
    paged["hyspec"] = float(_bf16_drift(a[None], greedy_paged(bf16, prompt, steps=4)[1][None])[0])
    paged["hyspec_before_fix"] = float(_bf16_drift(a[None], greedy_paged(before, prompt, steps=4)[1][None])[0])
    forced = {"hyspec": [], "hyspec_before_fix": [], "transformers": []}
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        p = torch.randint(3, 128, (12,), generator=g).tolist()
        toks, ref = greedy_paged(fp32, p, steps=4)
        forced["hyspec"].append(float(_bf16_drift(ref[None], teacher_forced_paged(bf16, p, toks)[None])[0]))
        forced["hyspec_before_fix"].append(float(_bf16_drift(ref[None], teacher_forced_paged(before, p, toks)[None])[0]))
        with torch.no_grad():
            seq = torch.tensor([p + toks[:-1]])
            forced["transformers"].append(float(_bf16_drift(hf(seq).logits[:, len(p) - 1:],
                                                            hf16(seq).logits[:, len(p) - 1:])[0]))
    return {"family": family, "sequences": list(ids.shape),
            "paged_forced_20_prompts_mean": {k: round(sum(v) / len(v), 3) for k, v in forced.items()},
            "paged_forced_20_prompts_max": {k: round(max(v), 3) for k, v in forced.items()},
            "dense_mean": {k: round(float(v.mean()), 3) for k, v in dense.items()},
            "dense_max": {k: round(float(v.max()), 3) for k, v in dense.items()},
            "paged_single_prompt": {k: round(v, 3) for k, v in paged.items()}}


def _row(result) -> dict:
    return {"status": result.status, "detail": result.detail}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--moe-gguf", action="store_true")
    parser.add_argument("--longrope", action="store_true")
    parser.add_argument("--gemma", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.gemma:
        out = json.loads(args.out.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            for arch in ("gemma2", "gemma3_text"):
                out["logits_vs_transformers"][arch] = [logit_differences(f, Path(tmp)) for f in ARCHITECTURES[arch]]
            for gguf_arch, arch in (("gemma2", "gemma2"), ("gemma3", "gemma3_text")):
                out["gguf_round_trip"][arch] = gguf_round_trip(gguf_arch, Path(tmp))
            out["gemma_bf16_drift"] = [gemma_bf16_drift(f, Path(tmp)) for f in ARCHITECTURES["gemma2"]
                                       + ARCHITECTURES["gemma3_text"]]
            print(json.dumps(out["gemma_bf16_drift"], indent=1), flush=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        return
    if args.longrope:
        out = json.loads(args.out.read_text()) if args.out.exists() else {"identity": {}}
        with tempfile.TemporaryDirectory() as tmp:
            out["longrope"] = {"logits_vs_transformers": [longrope_regimes(f, Path(tmp)) for f in LONGROPE_FAMILIES],
                               "gguf_round_trip": longrope_gguf_round_trip(Path(tmp))}
            print(json.dumps(out["longrope"], indent=1), flush=True)
            out["identity"]["phi3_longrope"] = identity_matrix("phi3_longrope", Path(tmp),
                                                               ["ngram"] if args.quick else None)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        return
    if args.moe_gguf:
        out = json.loads(args.out.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            for name in MOE_GGUF_SOURCES:
                out["gguf_round_trip"][name] = moe_gguf_round_trip(name, Path(tmp))
                print(name, "gguf", out["gguf_round_trip"][name], flush=True)
        args.out.write_text(json.dumps(out, indent=1) + "\n")
        return
    out: dict = {"machine": {"platform": platform.platform(), "processor": platform.processor(),
                             "python": platform.python_version(), "torch": torch.__version__},
                 "logits_vs_transformers": {}, "gguf_round_trip": {}, "identity": {}}
    import transformers

    out["machine"]["transformers"] = transformers.__version__
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for arch, families in ARCHITECTURES.items():
            out["logits_vs_transformers"][arch] = [logit_differences(f, root) for f in families[:1 if args.quick
                                                                                               else None]]
            print(arch, [(r["family"], r["paged_max_abs_logit_diff"], r["greedy_tokens_equal"])
                         for r in out["logits_vs_transformers"][arch]], flush=True)
        for gguf_arch, arch in (("gemma2", "gemma2"), ("gemma3", "gemma3_text"), ("phi3", "phi3")):
            out["gguf_round_trip"][arch] = gguf_round_trip(gguf_arch, root)
            print(arch, "gguf", out["gguf_round_trip"][arch], flush=True)
        for name in MOE_GGUF_SOURCES:
            out["gguf_round_trip"][name] = moe_gguf_round_trip(name, root)
            print(name, "gguf", out["gguf_round_trip"][name], flush=True)
        for arch in IDENTITY_TARGETS:
            out["identity"][arch] = identity_matrix(arch, root, ["ngram"] if args.quick else None)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
