"""What ``quantization="a8"`` costs in quality against the exact default path, on the default model (issue 51).

a8 multiplies the GGUF's Q4/Q8 codes by activations rounded to 8 bits per 32-element block
(cpu_ops/qgemm_a8.c).  Its kernel is fast only with AVX-512 VNNI; elsewhere the portable build gives the
same bits (``HYSPEC_A8_PORTABLE=1`` lets it run) but ~16x slower than the exact path, too slow for tens of
thousands of tokens on a 2-core VM.  So the bulk of the measurement runs a8 *emulated*: the exact kernel
(qgemm.c) on activations first rounded exactly as qgemm_a8.c rounds them (per 32-block ``amax / 127``
steps, round-half-even, clamped to +-127).  Mathematically that is a8's product; the two differ only in
fp32 summation order.  ``--part validate`` measures that difference against the real kernel (portable
build) on held-out text and on greedy decoding, so the emulation's error is a number, not an assumption.

Parts (each writes WORK/<part>.json as it goes; ``--part collect`` merges them into --out):

* ``validate``  real a8 (portable build) vs its emulation vs exact: logits of held-out windows, greedy tokens.
* ``perplexity`` held-out CPython text not used to train the drafters (see held_out_documents), windows of
  --window tokens with --stride; per window the summed NLL on both paths; a paired bootstrap over windows
  of the difference of mean NLL, and the bootstrap noise of each path's own mean NLL.
* ``greedy``    HumanEval prompts x --max-tokens greedy tokens on both paths: agreement, first divergence.
* ``lm-eval``   the lm-eval tasks of docs/lm_eval/tasks through lm-eval's harness, hyspec in-process.

    HYSPEC_A8_PORTABLE=1 python scripts/a8_quality.py --part validate
    python scripts/a8_quality.py --part perplexity --tokens 20000
    python scripts/a8_quality.py --part greedy
    python scripts/a8_quality.py --part lm-eval
    python scripts/a8_quality.py --part collect --out docs/results/2026-12-06/a8-quality/a8_quality.json
"""
from __future__ import annotations

import argparse
import contextlib
import html.parser
import json
import math
import platform
import random
import sysconfig
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------- emulation
def round_like_a8(x: torch.Tensor) -> torch.Tensor:
    """``x [rows, K]`` fp32 rounded as qgemm_a8.c's a8_quantize_block rounds it: per 32-element block
    ``d = amax / 127``, ``q = rint(x * (127 / amax))`` clamped to +-127 (0 for an all-zero block), ``q * d``."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    # tensor / tensor: torch computes ``scalar / tensor`` (and may compute ``tensor / scalar``) through a
    # reciprocal, one ulp away from C's division, which moves values that sit on a rounding boundary
    c127 = torch.full_like(amax, 127.0)
    step = amax / c127
    inv = torch.where(amax > 0, c127 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * inv).clamp_(-127, 127)  # torch.round: half to even, as lrintf / cvtps
    return (q * step).reshape_as(x)


class A8Emulation:
    """Switches every block linear of an exact LLM (and its quantized head) between the exact product and
    the exact product of a8-rounded activations.  The layer loop is used (the C decoder stack calls the
    kernels directly, past the modules)."""

    def __init__(self, llm: Any):
        from hyspec.cpu_ops.qgemm import BlockLinear
        from hyspec.cpu_ops.quantized_linear import QUANTIZED_HEADS

        model = llm.engine.model
        model.layer_stack = None
        linears = [m for m in model.modules() if isinstance(m, BlockLinear)]
        head = QUANTIZED_HEADS.get(model.lm_head_weight)
        if head is not None and head not in linears:
            linears.append(head)
        if any(m.a8 for m in linears) or not linears:
            raise RuntimeError("A8Emulation needs the exact block-kernel path (dtype float32, no quantization=)")
        self.on, self.count = False, len(linears)
        for m in linears:
            exact = m._gemm
            m._gemm = (lambda bt, rows, blocks, n, _exact=exact:
                       _exact(bt, round_like_a8(rows) if self.on else rows, blocks, n))

    @contextlib.contextmanager
    def active(self, on: bool = True):
        before, self.on = self.on, on
        try:
            yield
        finally:
            self.on = before


def load(quantization: str | None = None):
    from hyspec import LLM

    return LLM(dtype="float32", quantization=quantization, max_model_len=2048, kv_cache_bytes=256 << 20)


def logits_of(llm: Any, ids: list[int]) -> torch.Tensor:
    model = llm.engine.model
    with torch.inference_mode():
        return model.compute_logits(model.forward_dense(torch.tensor([ids])).hidden[0]).float()


# ---------------------------------------------------------------------------------------------- held-out text
class _Text(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def held_out_documents() -> dict[str, list[tuple[str, str]]]:
    """CPython text the drafters never saw.  Their data (core/train/data.py, scripts/build_drafter_prompts.py)
    is every ``*.py`` of this Python's stdlib and ``pydoc_data.topics``; these are CPython's own *non-Python*
    files installed beside it: IDLE's manual (idlelib/help.html, rendered from Doc/library/idle.rst), the
    email package's architecture notes (an .rst), IDLE's README / HISTORY / NEWS (prose), and the C API
    headers (include/python3.X/**/*.h, CPython's C sources)."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    parser = _Text()
    parser.feed((lib / "idlelib/help.html").read_text(encoding="utf-8"))
    text = "\n".join(line.strip() for line in "".join(parser.parts).splitlines())
    docs.append(("idlelib/help.html (text)", "\n".join(p for p in text.split("\n\n") if p.strip())))
    for name in ("email/architecture.rst", "idlelib/README.txt", "idlelib/HISTORY.txt", "idlelib/NEWS.txt"):
        docs.append((name, (lib / name).read_text(encoding="utf-8")))
    include = Path(sysconfig.get_paths()["include"])
    headers = [(str(p.relative_to(include.parent)), p.read_text(encoding="utf-8", errors="replace"))
               for p in sorted(include.rglob("*.h"))]
    return {"docs": docs, "c-headers": headers}


def windows(ids: list[int], window: int, stride: int) -> list[tuple[int, int, int]]:
    """(start, end, first scored target index) per window; each target token is scored exactly once."""
    out, start = [], 0
    while start + 1 < len(ids):
        end = min(start + window, len(ids))
        out.append((start, end, start + 1 if start == 0 else start + window - stride))
        if end == len(ids):
            break
        start += stride
    return out


def bootstrap(values: list[tuple[float, float, int]], resamples: int, seed: int = 0) -> dict[str, Any]:
    """values: per window (exact NLL sum, a8 NLL sum, tokens).  Paired: the difference of mean NLL per token
    over resampled windows; unpaired: each path's own mean NLL (its sampling noise)."""
    rng = random.Random(seed)
    n = len(values)
    diffs, exacts = [], []
    for _ in range(resamples):
        pick = [values[rng.randrange(n)] for _ in range(n)]
        tokens = sum(v[2] for v in pick)
        diffs.append((sum(v[1] for v in pick) - sum(v[0] for v in pick)) / tokens)
        exacts.append(sum(v[0] for v in pick) / tokens)
    diffs.sort()
    exacts.sort()

    def ci(xs):
        return [xs[int(0.025 * len(xs))], xs[int(0.975 * len(xs)) - 1]]

    def sd(xs):
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))

    return {"resamples": resamples, "windows": n, "delta_nll_ci95": ci(diffs), "delta_nll_sd": sd(diffs),
            "exact_mean_nll_ci95": ci(exacts), "exact_mean_nll_sd": sd(exacts)}


# ---------------------------------------------------------------------------------------------- parts
def part_perplexity(args, emu, llm) -> dict[str, Any]:
    docs = held_out_documents()
    per_genre = args.tokens // len(docs)
    report: dict[str, Any] = {"window": args.window, "stride": args.stride, "genres": {}}
    all_values = []
    for genre, items in docs.items():
        ids: list[int] = []
        used = []
        for name, text in items:
            if len(ids) >= per_genre:
                break
            ids.extend(llm.tokenizer.encode(text + "\n\n"))
            used.append(name)
        ids = ids[:per_genre + 1]
        values, worst, agree, scored = [], 0.0, 0, 0
        for start, end, first in windows(ids, args.window, args.stride):
            seq = ids[start:end]
            target = torch.tensor(seq[first - start:])
            row = slice(first - start - 1, end - start - 1)
            with emu.active(False):
                exact = logits_of(llm, seq)[row]
            with emu.active(True):
                a8 = logits_of(llm, seq)[row]
            nll = [float(torch.nn.functional.cross_entropy(lg, target, reduction="sum")) for lg in (exact, a8)]
            values.append((nll[0], nll[1], len(target)))
            worst = max(worst, float((a8 - exact).abs().max()))
            agree += int((a8.argmax(-1) == exact.argmax(-1)).sum())
            scored += len(target)
            all_values.append(values[-1])
            report["genres"][genre] = _ppl_summary(values, used, worst, agree, scored)
            report["genres"][genre]["per_window_nll_sums"] = values  # (exact, a8, tokens): a rerun's bootstrap
            _save(args, "perplexity", report)
            print(genre, len(values), report["genres"][genre]["mean_nll"], flush=True)
    report["all"] = _ppl_summary(all_values, [], None, None, None)
    report["bootstrap"] = bootstrap(all_values, args.resamples)
    return report


def _ppl_summary(values, used, worst, agree, scored) -> dict[str, Any]:
    tokens = sum(v[2] for v in values)
    exact, a8 = sum(v[0] for v in values) / tokens, sum(v[1] for v in values) / tokens
    out = {"tokens": tokens, "windows": len(values), "mean_nll": {"exact": exact, "a8": a8},
           "perplexity": {"exact": math.exp(exact), "a8": math.exp(a8)}, "delta_nll": a8 - exact,
           "windows_a8_worse": sum(v[1] > v[0] for v in values)}
    if used:
        out["files"] = used
    if worst is not None:
        out["max_abs_logit_diff"] = worst
        out["top1_agreement"] = agree / scored
    return out


def humaneval(count: int, offset: int) -> list[str]:
    from hyspec.train.data import humaneval_prompts

    return humaneval_prompts()[offset:offset + count]


def part_greedy(args, emu, llm) -> dict[str, Any]:
    from hyspec import SamplingParams

    prompts = humaneval(args.prompts, args.prompt_offset)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    with emu.active(False):
        exact = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    with emu.active(True):
        a8 = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    firsts = [next((i for i, (x, y) in enumerate(zip(e, a)) if x != y), None) for e, a in zip(exact, a8)]
    same_tokens = sum(sum(x == y for x, y in zip(e, a)) for e, a in zip(exact, a8))
    return {"prompts": f"HumanEval {args.prompt_offset}..{args.prompt_offset + len(prompts) - 1}",
            "max_tokens": args.max_tokens, "identical": sum(f is None for f in firsts), "count": len(prompts),
            "first_divergence": firsts,
            "tokens_before_first_divergence": sum(args.max_tokens if f is None else f for f in firsts),
            "tokens_total": args.max_tokens * len(prompts),
            "position_wise_equal_tokens": same_tokens}


def part_validate(args, emu, llm) -> dict[str, Any]:
    """The real kernel (portable build unless this CPU has VNNI) against its emulation, and both against exact."""
    from hyspec import SamplingParams
    from hyspec.cpu_ops import qgemm_a8

    if not qgemm_a8.available()[0]:
        raise SystemExit(f"the a8 kernel does not run here: {qgemm_a8.available()[1]}")
    real = load("a8")
    ids = llm.tokenizer.encode(held_out_documents()["docs"][0][1])
    out: dict[str, Any] = {"a8_kernel": qgemm_a8.isa(), "windows": []}
    for start in range(0, args.validate_windows * args.validate_len, args.validate_len):
        seq = ids[start:start + args.validate_len]
        target = torch.tensor(seq[1:])
        with emu.active(False):
            exact = logits_of(llm, seq)[:-1]
        with emu.active(True):
            emulated = logits_of(llm, seq)[:-1]
        kernel = logits_of(real, seq)[:-1]
        nll = {k: float(torch.nn.functional.cross_entropy(v, target)) for k, v in
               (("exact", exact), ("a8 emulated", emulated), ("a8 kernel", kernel))}
        out["windows"].append({"tokens": len(seq), "mean_nll": nll,
                               "max_abs_logit_diff": {"a8 kernel vs emulated": float((kernel - emulated).abs().max()),
                                                      "a8 kernel vs exact": float((kernel - exact).abs().max())},
                               "argmax_equal kernel vs emulated": int((kernel.argmax(-1) == emulated.argmax(-1)).sum())})
        _save(args, "validate", out)
        print(out["windows"][-1], flush=True)
    prompts = humaneval(args.validate_prompts, args.prompt_offset)
    params = SamplingParams(temperature=0, max_tokens=args.validate_tokens, ignore_eos=True)
    with emu.active(True):
        emulated_tokens = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    kernel_tokens = [o.outputs[0].token_ids for o in real.generate(prompts, params)]
    out["greedy"] = {"prompts": len(prompts), "max_tokens": args.validate_tokens,
                     "kernel_equals_emulation": sum(a == b for a, b in zip(emulated_tokens, kernel_tokens))}
    return out


def part_lm_eval(args, emu, llm) -> dict[str, Any]:
    """lm-eval's harness on docs/lm_eval/tasks with an in-process LM over the same LLM, on both paths (the
    server route of scripts/lm_eval_side_by_side.py would need the emulation inside the server)."""
    import lm_eval
    from hyspec import SamplingParams
    from hyspec.bench.vs_lm_eval import (
        GEN_TASK,
        MC_TASK,
        REPO_ROOT,
        TASKS_DIR,
        generations,
        loglikelihoods,
    )
    from lm_eval.api.model import LM
    from lm_eval.tasks import TaskManager

    tok = llm.tokenizer

    class HyspecLM(LM):
        def loglikelihood(self, requests):
            out = []
            for req in requests:
                context, continuation = req.args
                spaces = len(context) - len(context.rstrip())
                if spaces:  # lm-eval's own split: trailing spaces belong to the continuation
                    context, continuation = context[:-spaces], context[-spaces:] + continuation
                whole, ctx = tok.encode(context + continuation), tok.encode(context)
                cont = whole[len(ctx):]
                logp = torch.log_softmax(logits_of(llm, whole)[len(ctx) - 1:-1], -1)
                target = torch.tensor(cont)
                out.append((float(logp.gather(1, target[:, None]).sum()), bool((logp.argmax(-1) == target).all())))
            return out

        def loglikelihood_rolling(self, requests):
            raise NotImplementedError("hyspec_python_mc / hyspec_arith_gen make no rolling requests")

        def generate_until(self, requests):
            out = []
            for req in requests:
                context, kwargs = req.args
                until = list(kwargs.get("until", []))
                params = SamplingParams(temperature=0, max_tokens=int(kwargs.get("max_gen_toks", 256)), stop=until)
                text = llm.generate([context], params)[0].outputs[0].text
                for stop in until:
                    text = text.split(stop)[0]
                out.append(text)
            return out

    result: dict[str, Any] = {}
    for path in ("exact", "a8"):
        with emu.active(path == "a8"), contextlib.chdir(REPO_ROOT):
            t0 = time.perf_counter()
            res = lm_eval.simple_evaluate(model=HyspecLM(), tasks=[MC_TASK, GEN_TASK], batch_size=1, limit=args.limit,
                                          task_manager=TaskManager(include_path=str(TASKS_DIR)), log_samples=True)
        result[path] = {"seconds": round(time.perf_counter() - t0, 1),
                        "metrics": {t: {k: v for k, v in vals.items() if isinstance(v, (int, float))}
                                    for t, vals in res["results"].items()},
                        "loglikelihoods": {f"{d}/{c}": v for (d, c), v in loglikelihoods(res, MC_TASK).items()},
                        "generations": generations(res, GEN_TASK)}
        _save(args, "lm-eval", result)
    ll = [(result["exact"]["loglikelihoods"][k], result["a8"]["loglikelihoods"][k]) for k in result["exact"]["loglikelihoods"]]
    result["compare"] = {
        "loglikelihood_requests": len(ll),
        "max_abs_loglikelihood_diff": max(abs(e[0] - a[0]) for e, a in ll),
        "is_greedy_agree": sum(e[1] == a[1] for e, a in ll),
        "mc_choice_agree": _mc_choices_agree(result),
        "generations_identical": sum(result["exact"]["generations"][d] == result["a8"]["generations"].get(d)
                                     for d in result["exact"]["generations"]),
        "generate_docs": len(result["exact"]["generations"])}
    return result


def _mc_choices_agree(result) -> int:
    picks = {}
    for path in ("exact", "a8"):
        best: dict[str, tuple[float, str]] = {}
        for key, (ll, _) in result[path]["loglikelihoods"].items():
            doc, choice = key.split("/")
            if doc not in best or ll > best[doc][0]:
                best[doc] = (ll, choice)
        picks[path] = {d: c for d, (_, c) in best.items()}
    return sum(picks["exact"][d] == picks["a8"][d] for d in picks["exact"])


def table(merged: dict[str, Any]) -> str:
    """The README's perplexity table (markdown) from a collected JSON."""
    ppl = merged.get("perplexity")
    if not ppl:
        return "(no perplexity part)"
    header = ("| text | tokens (windows) | ppl exact | ppl a8 | mean NLL exact | mean NLL a8 | delta NLL (a8 - exact) "
              "| windows a8 worse | top-1 agree | max abs logit diff |")
    rows = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, g in [*ppl["genres"].items(), *([("all", ppl["all"])] if "all" in ppl else [])]:
        rows.append(f"| {name} | {g['tokens']} ({g['windows']}) | {g['perplexity']['exact']:.3f} | "
                    f"{g['perplexity']['a8']:.3f} | {g['mean_nll']['exact']:.4f} | {g['mean_nll']['a8']:.4f} | "
                    f"{g['delta_nll']:+.4f} | {g['windows_a8_worse']}/{g['windows']} | "
                    + (f"{g['top1_agreement']:.4f} | {g['max_abs_logit_diff']:.2f} |" if "top1_agreement" in g
                       else "-- | -- |"))
    b = ppl.get("bootstrap")
    if b:
        rows.append(f"\npaired bootstrap ({b['resamples']} resamples of {b['windows']} windows): delta NLL 95% CI "
                    f"[{b['delta_nll_ci95'][0]:+.4f}, {b['delta_nll_ci95'][1]:+.4f}], sd {b['delta_nll_sd']:.4f}; "
                    f"exact mean NLL alone: 95% CI [{b['exact_mean_nll_ci95'][0]:.4f}, "
                    f"{b['exact_mean_nll_ci95'][1]:.4f}], sd {b['exact_mean_nll_sd']:.4f}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------------------------- plumbing
def _save(args, part: str, data: dict[str, Any]) -> None:
    args.work.mkdir(parents=True, exist_ok=True)
    (args.work / f"{part}.json").write_text(json.dumps(data, indent=1) + "\n")


def _machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    return {"cpu": cpu, "avx512_vnni": "avx512_vnni" in flags, "python": platform.python_version(),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", required=True, choices=("validate", "perplexity", "greedy", "lm-eval", "collect"))
    ap.add_argument("--work", type=Path, default=REPO / ".bench-work/a8-quality")
    ap.add_argument("--out", type=Path, default=REPO / "docs/results/2026-12-06/a8-quality/a8_quality.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=20000, help="perplexity: scored tokens, split over the genres")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--stride", type=int, default=384)
    ap.add_argument("--resamples", type=int, default=10000)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--prompt-offset", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None, help="lm-eval: items per task (default: all)")
    ap.add_argument("--validate-windows", type=int, default=2)
    ap.add_argument("--validate-len", type=int, default=96)
    ap.add_argument("--validate-prompts", type=int, default=2)
    ap.add_argument("--validate-tokens", type=int, default=24)
    args = ap.parse_args()
    if args.part == "collect":
        merged = {"machine": _machine(), "script": "scripts/a8_quality.py"}
        for part in ("validate", "perplexity", "greedy", "lm-eval"):
            path = args.work / f"{part}.json"
            if path.exists():
                merged[part] = json.loads(path.read_text())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(merged, indent=1) + "\n")
        print(table(merged))
        return 0
    torch.set_num_threads(args.threads)
    llm = load()
    emu = A8Emulation(llm)
    t0 = time.perf_counter()
    run = {"validate": part_validate, "perplexity": part_perplexity, "greedy": part_greedy,
           "lm-eval": part_lm_eval}[args.part]
    report = run(args, emu, llm)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    report["machine"] = _machine()
    report["emulated_linears"] = emu.count
    _save(args, args.part, report)
    print(json.dumps({k: v for k, v in report.items() if k not in ("windows",)}, indent=1)[:3000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
