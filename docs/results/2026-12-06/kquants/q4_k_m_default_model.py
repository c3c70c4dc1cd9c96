"""The default model requantized to a Q4_K_M type mix here, then decoded: as stored vs dense-dequantized vs Q4_1.

llama.cpp is not installed here and the gguf package cannot quantize Q4_K / Q6_K, so this script has its own
simple quantizers for those two (per sub-block min/max, 6-bit / int8 sub-scales; no search, so its error is
larger than llama.cpp's make_qkx2_quants: the file is for speed and identity checks, not for quality).  The
type of each tensor follows llama.cpp's Q4_K_M choice as published in src/llama-quant.cpp
(llama_tensor_get_type, github.com/ggml-org/llama.cpp): Q6_K for the output (the tied embedding here) and
for attn_v / ffn_down in the "more bits" layers, Q4_K elsewhere; a matrix whose rows are not whole
256-weight super-blocks falls back to Q5_0 (for Q4_K) or Q8_0 (for Q6_K).  For SmolLM2-135M (hidden 576)
that gives Q5_0 / Q8_0 for everything but ffn_down (Q4_K / Q6_K), as the issue's llama.cpp file had.

Then, interleaved in one process (batch 1, greedy, EOS ignored): tokens/s of the Q4_1 default file, of the
Q4_K_M file as stored (kquants.c), and of the same file with Q5_0 / K-quant tensors dequantized to dense
fp32 (how hyspec loaded them before); and whether the as-stored tokens equal the dense (quantization="none")
path's.

    TORCH_DEVICE_BACKEND_AUTOLOAD=0 .venv/bin/python docs/results/2026-12-06/kquants/q4_k_m_default_model.py \
        --out docs/results/2026-12-06/kquants/q4_k_m_default_model.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import numpy as np

QK = 256


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """``[rows, cols]`` fp32 -> Q4_K blocks ``[rows, cols / 256 * 144]`` (w = d sc q - dmin m, q 0..15)."""
    rows = x.shape[0]
    sub = x.reshape(-1, 8, 32).astype(np.float32)
    lo, hi = np.minimum(sub.min(-1), 0), sub.max(-1)
    scale, mins = (hi - lo) / 15, -lo
    d = _f16(np.maximum(scale.max(-1), 1e-8) / 63)
    dmin = _f16(np.maximum(mins.max(-1), 1e-8) / 63)
    sc = np.clip(np.round(scale / d.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    m = np.clip(np.round(mins / dmin.astype(np.float32)[:, None]), 0, 63).astype(np.uint8)
    ds = d.astype(np.float32)[:, None] * sc
    dm = dmin.astype(np.float32)[:, None] * m
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(ds[..., None] > 0, np.round((sub + dm[..., None]) / ds[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)
    scales = np.empty((sub.shape[0], 12), np.uint8)
    scales[:, 0:4] = (sc[:, :4] & 63) | ((sc[:, 4:] >> 4) << 6)
    scales[:, 4:8] = (m[:, :4] & 63) | ((m[:, 4:] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    pairs = q.reshape(-1, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(-1, 128)
    out = np.concatenate([d.view(np.uint8).reshape(-1, 2), dmin.view(np.uint8).reshape(-1, 2), scales, qs], axis=1)
    return out.reshape(rows, -1)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """``[rows, cols]`` fp32 -> Q6_K blocks ``[rows, cols / 256 * 210]`` (w = d sc (q - 32), a scale per 16)."""
    rows = x.shape[0]
    sub = x.reshape(-1, 16, 16).astype(np.float32)
    scale = np.abs(sub).max(-1) / 31
    d = _f16(np.maximum(scale.max(-1), 1e-8) / 127)
    sc = np.clip(np.round(scale / d.astype(np.float32)[:, None]), -128, 127).astype(np.int8)
    eff = d.astype(np.float32)[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(eff[..., None] > 0, np.round(sub / eff[..., None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.uint8).reshape(-1, 2, 128)  # element h * 128 + r
    low, high = q & 15, q >> 4
    ql = (low[..., :64] | (low[..., 64:] << 4)).reshape(-1, 128)
    h4 = high.reshape(-1, 2, 4, 32)
    qh = (h4[:, :, 0] | (h4[:, :, 1] << 2) | (h4[:, :, 2] << 4) | (h4[:, :, 3] << 6)).reshape(-1, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d.view(np.uint8).reshape(-1, 2)], axis=1)
    return out.reshape(rows, -1)


def q4_k_m_type(name: str, cols: int, layers: int, tied: bool) -> str:
    def more_bits(i: int) -> bool:  # llama.cpp's use_more_bits
        return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2

    want = "Q4_K"
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        want = "Q6_K"
    elif name.startswith("blk.") and name.split(".")[2] in ("attn_v", "ffn_down") and more_bits(int(name.split(".")[1])):
        want = "Q6_K"
    if cols % QK:
        return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[want]
    return want


def requantize(src: Path, out: Path) -> Counter:
    import gguf
    from gguf import quants

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    layers = int(reader.fields[f"{arch}.block_count"].contents())
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    writer = gguf.GGUFWriter(str(out), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub)
    types: Counter = Counter()
    for t in reader.tensors:
        values = np.ascontiguousarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if values.ndim == 1 or len(t.shape) == 1:
            writer.add_tensor(t.name, values.reshape(-1))
            types["F32"] += 1
            continue
        values = values.reshape(-1, int(t.shape[0]))
        qtype = q4_k_m_type(t.name, values.shape[1], layers, tied)
        if qtype == "Q4_K":
            data = quantize_q4_k(values)
        elif qtype == "Q6_K":
            data = quantize_q6_k(values)
        else:
            data = quants.quantize(values, getattr(gguf.GGMLQuantizationType, qtype))
        writer.add_tensor(t.name, data, raw_dtype=getattr(gguf.GGMLQuantizationType, qtype))
        types[qtype] += 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return types


PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n\ndef normalize(x):",
           "Write a haiku about the sea."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default="/tmp/kquants/SmolLM2-135M-Instruct.Q4_K_M-hyspec.gguf")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads (default: torch's)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    import hyspec.model.gguf_checkpoint as gc
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_model

    path = Path(args.file)
    path.parent.mkdir(parents=True, exist_ok=True)
    types = requantize(default_model(), path)
    print("types", dict(types), flush=True)
    kv = dict(kv_cache_bytes=64 << 20, max_model_len=512)
    engines = {"q4_1_default": LLM(str(default_model()), **kv), "q4_k_m_as_stored": LLM(str(path), **kv)}
    stored = gc.stored_blocks
    gc.stored_blocks = lambda *a, **k: None  # how these types loaded before: dequantized to dense weights
    try:
        engines["q4_k_m_dense_before"] = LLM(str(path), **kv)
    finally:
        gc.stored_blocks = stored
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    reports = {name: e.engine.quantization.to_dict() for name, e in engines.items()}
    tokens, rates = {}, {name: [] for name in engines}
    for _ in range(args.rounds):
        for name, e in engines.items():
            t0 = time.perf_counter()
            outs = [e.generate([p], params)[0].outputs[0].token_ids for p in PROMPTS]
            rates[name].append(len(PROMPTS) * args.tokens / (time.perf_counter() - t0))
            tokens[name] = outs
            print(name, round(rates[name][-1], 2), "tokens/s", flush=True)
    reference = LLM(str(path), **kv, dtype="float32", quantization="none")
    dense_tokens = [reference.generate([p], params)[0].outputs[0].token_ids for p in PROMPTS]
    result = {"what": "SmolLM2-135M requantized to a Q4_K_M type mix by this script; batch 1 decode, interleaved",
              "machine": "2-core AMD EPYC (Zen 3) VM shared with other jobs", "threads": torch.get_num_threads(),
              "load_average": os.getloadavg(), "file_types": dict(types), "quantization_reports": reports,
              "tokens_per_s_median": {k: round(statistics.median(v), 2) for k, v in rates.items()},
              "tokens_per_s_rounds": {k: [round(r, 2) for r in v] for k, v in rates.items()},
              "as_stored_tokens_equal_dense_reference": tokens["q4_k_m_as_stored"] == dense_tokens,
              "as_stored_tokens_equal_dense_before": tokens["q4_k_m_as_stored"] == tokens["q4_k_m_dense_before"],
              "prompts": PROMPTS, "max_tokens": args.tokens}
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
