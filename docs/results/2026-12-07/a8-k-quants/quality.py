"""Perplexity of quantization="a8" against the exact path on a GGUF (issue 51's a8 table, here for a Q4_K_M file):
the held-out CPython text of scripts/a8_quality.py (IDLE's manual, the C API headers), windows of 512 tokens with
stride 384, both paths loaded side by side and scored with the real kernels (this needs AVX-512 VNNI), a paired
bootstrap over the windows.

    .venv/bin/python docs/results/2026-12-07/a8-k-quants/quality.py MODEL.gguf [--tokens 16000] [--json OUT]
"""
import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "scripts"))
from a8_quality import _ppl_summary, bootstrap, held_out_documents, logits_of, windows  # noqa: E402

from hyspec import LLM  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--tokens", type=int, default=16000)
ap.add_argument("--window", type=int, default=512)
ap.add_argument("--stride", type=int, default=384)
ap.add_argument("--json", type=Path)
args = ap.parse_args()
kw = dict(dtype="float32", max_model_len=2048, kv_cache_bytes=256 << 20)
exact, a8 = LLM(args.model, **kw), LLM(args.model, quantization="a8", **kw)
report = {"model": Path(args.model).name, "a8_fallbacks": a8.engine.quantization.fallbacks, "genres": {}}
docs = held_out_documents()
all_values = []
for genre, items in docs.items():
    ids, used = [], []
    for name, text in items:
        if len(ids) >= args.tokens // len(docs):
            break
        ids.extend(exact.tokenizer.encode(text + "\n\n"))
        used.append(name)
    ids = ids[:args.tokens // len(docs) + 1]
    values, worst, agree, scored = [], 0.0, 0, 0
    for start, end, first in windows(ids, args.window, args.stride):
        seq = ids[start:end]
        target = torch.tensor(seq[first - start:])
        rows = slice(first - start - 1, end - start - 1)
        le, la = logits_of(exact, seq)[rows], logits_of(a8, seq)[rows]
        values.append(tuple(float(torch.nn.functional.cross_entropy(lg, target, reduction="sum")) for lg in (le, la))
                      + (len(target),))
        worst = max(worst, float((la - le).abs().max()))
        agree += int((la.argmax(-1) == le.argmax(-1)).sum())
        scored += len(target)
    all_values += values
    report["genres"][genre] = _ppl_summary(values, used, worst, agree, scored)
report["all"] = _ppl_summary(all_values, None, None, 0, 0)
report["all"]["bootstrap"] = bootstrap(all_values, 10000)
text = json.dumps(report, indent=1)
if args.json:
    args.json.write_text(text + "\n")
print(text)
exact.close()
a8.close()
