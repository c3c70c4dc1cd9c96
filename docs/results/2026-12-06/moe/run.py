"""A MoE target on the CPU: resident memory of a loaded MoE GGUF and plain greedy decode speed, hyspec beside
transformers on the same weights.

A Mixtral-shaped random model (hidden 1024, 8 experts, top-2, expert width 2048, 4 layers, 16 query / 4 KV
heads, vocabulary 32000) is written in the published Hugging Face layout and converted to GGUF files as
llama.cpp's converter writes them (tests.model.gguf_moe_fixtures: Q8_0 and Q4_0, the routers F32); the source
checkpoint is rewritten with the values each file keeps, so every runner decodes the same weights.  Per
quantization type:

* memory: a fresh process per loader (``load_model``, cpu backend, fp32) reports the anonymous memory it holds
  after the load minus before (the file's mapped pages reported apart) and its peak resident set, for the
  experts kept as stored (the default) and for the experts dequantized at load (the path before 2026-12-06's
  change: the stored-experts plan emptied, so the attention linears and the head still run as stored);
* speed, interleaved per round in one process: transformers (``generate``, fp32), hyspec ``LLM`` on the GGUF
  with the experts as stored, the same with dense experts, and (``--safetensors``) hyspec on the safetensors
  source (fp32, dense everything); decode tokens/s with the time to the first token subtracted, batch 1, and
  batch 8 (aggregate).

    .venv/bin/python docs/results/2026-12-06/moe/run.py --out docs/results/2026-12-06/moe/result.json
    .venv/bin/python docs/results/2026-12-06/moe/run.py --small   # seconds: proves the script runs
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT))  # the test fixtures write the GGUF files and the tokenizer they embed


def make_target(path: Path, small: bool) -> None:
    import transformers

    from tests.model.tiny_checkpoint import write_tokenizer

    dims = dict(hidden_size=128, intermediate_size=256, vocab_size=512) if small else dict(
        hidden_size=1024, intermediate_size=2048, vocab_size=32000)
    cfg = transformers.MixtralConfig(num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=4,
                                     num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=4096,
                                     sliding_window=None, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                                     **dims)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gate.weight"):
                p.normal_()  # routers that spread tokens over the experts
    model.save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)  # the GGUF embeds one (its 320 tokens: the runs below pass token ids)


@contextmanager
def dense_experts():
    """hyspec as before experts were kept as stored: the loader's stored-experts plan emptied."""
    from hyspec.model import loader
    from hyspec.model.moe_stored import StoredExperts

    plan = loader.plan_stored_experts
    loader.plan_stored_experts = lambda *args, **kwargs: StoredExperts()
    try:
        yield
    finally:
        loader.plan_stored_experts = plan


_MEMORY_PROBE = """
import json, sys, torch
sys.path.insert(0, {root!r})
def rss(kind="RssAnon"):  # anonymous memory: what the process allocated, not the file's page cache it maps
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(kind + ":"))
import hyspec.model.loader, hyspec.backends.registry, hyspec.cpu_ops.qgemm, gguf
backend = hyspec.backends.registry.get_backend("cpu")
hyspec.cpu_ops.qgemm.library()
import gc
before, file_before, peak_before = rss(), rss("RssFile"), rss("VmHWM")  # (ru_maxrss would be the parent's)
if {dense}:
    from hyspec.model.moe_stored import StoredExperts
    hyspec.model.loader.plan_stored_experts = lambda *a, **k: StoredExperts()
model = hyspec.model.loader.load_model({path!r}, dtype="float32", backend=backend)
gc.collect()
after, file_after, peak = rss(), rss("RssFile"), rss("VmHWM")
held = sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))
print(json.dumps(dict(anon_before_mb=before / 2**20, anon_added_mb=(after - before) / 2**20,
                      file_mapped_added_mb=(file_after - file_before) / 2**20,
                      peak_before_mb=peak_before / 2**20, peak_mb=peak / 2**20,
                      tensors_mb=held / 2**20, report=model.quantization.summary())))
"""


def loaded_memory(path: Path, dense: bool) -> dict:
    """Resident memory a fresh process adds by loading ``path`` (the page cache of the file not counted)."""
    code = _MEMORY_PROBE.format(root=str(ROOT), dense=dense, path=str(path))
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in json.loads(out.stdout.splitlines()[-1]).items()}


def _timed(fn) -> float:
    """Seconds ``fn()`` took.  The time to the first token is the least of three such calls: one stall on the
    shared machine inside a single call once made it longer than a whole 17-token generation."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def hf_decode(model, prompt: list[int], steps: int) -> tuple[list[int], float, float]:
    ids = torch.tensor([prompt])
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=2, **kw)  # warm-up
        first = min(_timed(lambda: model.generate(ids, max_new_tokens=1, **kw)) for _ in range(3))
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=steps + 1, **kw)
        total = time.perf_counter() - t
    return out[0, len(prompt):].tolist(), first, total


def hyspec_decode(llm, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], float, float]:
    from hyspec import SamplingParams

    reqs = [{"prompt_token_ids": p} for p in prompts]
    llm.generate(reqs, SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))  # warm-up
    first = min(_timed(lambda: llm.generate(reqs, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)))
                for _ in range(3))
    t = time.perf_counter()
    outs = llm.generate(reqs, SamplingParams(temperature=0, max_tokens=steps + 1, ignore_eos=True))
    total = time.perf_counter() - t
    return [list(o.outputs[0].token_ids) for o in outs], first, total


def measure(src: Path, gguf_file: Path, steps: int, rounds: int, with_safetensors: bool) -> dict:
    import transformers
    from hyspec import LLM

    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, vocab, (32,), generator=g).tolist() for _ in range(8)]
    memory = {"experts_as_stored": loaded_memory(gguf_file, dense=False),
              "experts_dense": loaded_memory(gguf_file, dense=True)}
    if rounds == 0:
        return {"file_mb": round(gguf_file.stat().st_size / 2**20, 1), "memory": memory}
    kw = dict(dtype="float32", backend="cpu", skip_tokenizer_init=True, kv_cache_bytes=64 << 20)
    hf = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    llms = {"hyspec_gguf_experts_as_stored": LLM(str(gguf_file), **kw)}
    with dense_experts():
        llms["hyspec_gguf_experts_dense"] = LLM(str(gguf_file), **kw)
    if with_safetensors:
        llms["hyspec_safetensors_fp32"] = LLM(str(src), **kw)
    rows: dict[str, list[float]] = {"transformers_b1": []}
    for name in llms:
        rows[f"{name}_b1"], rows[f"{name}_b8"] = [], []
    same = {name: True for name in llms}
    for _ in range(rounds):
        hf_tokens, first, total = hf_decode(hf, prompts[0], steps)
        rows["transformers_b1"].append(steps / (total - first))
        for name, llm in llms.items():
            (tokens,), first, total = hyspec_decode(llm, prompts[:1], steps)
            rows[f"{name}_b1"].append(steps / (total - first))
            same[name] &= tokens == hf_tokens
            _, first, total = hyspec_decode(llm, prompts, steps)
            rows[f"{name}_b8"].append(8 * steps / (total - first))
    return {"file_mb": round(gguf_file.stat().st_size / 2**20, 1), "memory": memory,
            "report": llms["hyspec_gguf_experts_as_stored"].engine.quantization.summary(),
            "tokens_per_s_median": {k: round(statistics.median(v), 2) for k, v in rows.items()},
            "tokens_per_s_all": {k: [round(x, 2) for x in v] for k, v in rows.items()},
            "same_tokens_as_transformers": same}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true", help="a toy model and few steps: checks the script runs")
    ap.add_argument("--rounds", type=int, default=2, help="0: the memory probes only")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--qtypes", default="Q8_0,Q4_0")
    ap.add_argument("--safetensors", action="store_true", help="also hyspec on the safetensors source (fp32)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    steps = 8 if args.small else args.steps
    rounds = 1 if args.small else args.rounds
    from tests.model.gguf_moe_fixtures import write_moe_gguf

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "fp32"
        make_target(base, args.small)
        for qtype in args.qtypes.split(","):
            src = Path(tmp) / qtype
            shutil.copytree(base, src)
            gguf_file = write_moe_gguf(src, Path(tmp) / f"mixtral-{qtype}.gguf", qtype)  # src now holds its values
            results[qtype] = measure(src, gguf_file, steps, rounds, args.safetensors)
            print(qtype, json.dumps(results[qtype], indent=2), flush=True)
            shutil.rmtree(src)
    result = {
        "what": "loaded memory of a MoE GGUF, and plain greedy decode tokens/s after a 32-token prompt (fp32), "
                "Mixtral-shaped random target, per GGUF type; transformers and every hyspec runner decode the "
                "values the file keeps",
        "model": "hidden 1024, 8 experts top-2, expert width 2048, 4 layers, 16/4 heads, vocab 32000"
                 if not args.small else "toy (--small)",
        "steps": steps, "rounds": rounds, "by_type": results,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
                    "load_average_at_end": os.getloadavg(),
                    "note": "shared 2-core VM, other sessions' jobs running: timings are noisy"},
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
