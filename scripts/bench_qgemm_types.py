"""Where a GGUF's linears spend a forward pass, per block type: hyspec_qgemm on every matrix of the file (its own
stored blocks and shapes, the tied head included), CPU time per forward of M rows, summed by type; optionally a
baseline build of the kernels (``--baseline REV``, cpu_ops/*.c at a git revision) interleaved with the working
tree's, results compared bit for bit.

    .venv/bin/python scripts/bench_qgemm_types.py --gguf FILE [--rows 1,8] [--threads 1] [--repeats 5]
                                                  [--baseline REV] [--json OUT]

Each repeat walks every matrix of the file once, in file order, as a forward pass does, so a matrix's weights come
from wherever the previous ones left them (L3 or memory for a file this size).  CPU time is the process's (all
threads: OpenMP's spin-waiting counts with two), the steadier figure on a shared machine.  Attention, norms and
the rest of a forward pass are not in these figures.  Exit status 1 when the two builds differ in a single bit.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def file_matrices(path: str) -> list[tuple[str, str, torch.Tensor, int, int]]:
    """(name, block type, blocks [n, bytes per row], n, k) for every 2-D tensor the hyspec qgemm computes."""
    import gguf
    from hyspec.cpu_ops.qgemm import QTYPES

    out = []
    for t in gguf.GGUFReader(path).tensors:
        if len(t.shape) < 2 or int(t.shape[1]) == 1 or t.tensor_type.name not in QTYPES:
            continue
        k, n = int(t.shape[0]), int(t.shape[1])
        blocks = torch.from_numpy(np.array(t.data, copy=True).view(np.uint8).reshape(n, -1))
        out.append((t.name, t.tensor_type.name, blocks, n, k))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--rows", default="1,8")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", default=None, help="git revision of cpu_ops to compare against (interleaved)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--march", default="native",
                    help="-march of both builds (haswell: the AVX2 kernels, as on a Zen 3)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from hyspec.cpu_ops import qgemm as qg

    libs = {"candidate": qg.library() if args.march == "native" else qg.variant(args.march)}
    if args.baseline:
        from bench_cpu_rows import build_baseline, like

        _, old = build_baseline(args.baseline, Path(tempfile.mkdtemp(prefix="hyspec-types-")), args.march)
        libs = {"baseline": like(old, libs["candidate"], ("hyspec_qgemm", "hyspec_qgemm_isa"))} | libs
    mats = file_matrices(args.gguf)
    # the tied head: token_embd computes the logits when the file has no output.weight
    if not any(name == "output.weight" for name, *_ in mats):
        mats = [m if m[0] != "token_embd.weight" else ("head (tied token_embd)",) + m[1:] for m in mats]
    result = {"gguf": args.gguf, "threads": torch.get_num_threads(), "isa": qg.isa(libs["candidate"]), "rows": {}}
    for rows in [int(r) for r in args.rows.split(",")]:
        xs = {k: torch.randn(rows, k) for k in {m[4] for m in mats}}
        spent = {name: defaultdict(list) for name in libs}
        ys = {name: {} for name in libs}
        for rep in range(args.repeats + 1):
            for which in (list(libs) if rep % 2 == 0 else list(reversed(libs))):
                per_type = defaultdict(float)
                for name, qtype, blocks, n, k in mats:
                    c0 = time.process_time()
                    y = qg.qgemm(qtype, xs[k], blocks, n, lib=libs[which])
                    per_type[f"{qtype} {'head' if 'head' in name else f'{k}x{n}'}"] += time.process_time() - c0
                    ys[which][name] = y
                if rep:
                    for key, t in per_type.items():
                        spent[which][key].append(t)
        table = {}
        for key in sorted(spent["candidate"]):
            table[key] = {which: round(statistics.median(spent[which][key]) * 1e3 / rows, 4) for which in libs}
            table[key]["matrices"] = sum(1 for m in mats if f"{m[1]} {'head' if 'head' in m[0] else f'{m[4]}x{m[3]}'}"
                                         == key)
        total = {which: round(sum(v[which] for v in table.values()), 3) for which in libs}
        same = all(torch.equal(ys["candidate"][n], ys[w][n]) for w in libs for n in ys[w])
        result["rows"][rows] = {"cpu_ms_per_row": table, "total_cpu_ms_per_row": total, "bit_identical": same}
        print(f"M={rows}: cpu ms per row (median of {args.repeats}), {' / '.join(libs)}; identical={same}")
        for key, v in table.items():
            print(f"  {key:22s} x{v['matrices']:3d}  " + "  ".join(f"{v[w]:8.3f}" for w in libs))
        print(f"  {'total':27s} " + "  ".join(f"{total[w]:8.3f}" for w in libs))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(r["bit_identical"] for r in result["rows"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
