"""Per-row cost of the default GGUF's CPU path, a baseline build of the C kernels against the working tree's,
interleaved in one process: prefill of one long prompt, decode rows at batch 1 / 8 / 32, verification rows
(k + 1 = 5 per sequence), each as CPU seconds and wall seconds per token.

    .venv/bin/python scripts/bench_cpu_rows.py [--baseline REV] [--prefill 1024] [--repeats 5] [--kernel-ghz 2.45]
                                               [--threads 1] [--json OUT]

The baseline is cpu_ops/*.c and *.h as they were at ``--baseline`` (a git revision), built here with the flags
hyspec.cpu_ops.native uses; the candidate is the working tree's build.  Both are swapped into the same loaded
model (its decoder stack and the qgemm the logits head calls), so every figure compares kernels alone.  Each
measurement alternates baseline and candidate; the logits of both are compared bit for bit (the kernels must
not change a single result).  CPU time is the process's (all threads; OpenMP's spin-waiting counts), so on
a shared machine it is the steadier number; ``--threads 1`` gives one thread's cost.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def build_baseline(rev: str, out_dir: Path, march: str = "native") -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """The decoder stack and qgemm libraries of cpu_ops at ``rev``, with native.load's compiler flags."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-tree", "--name-only", rev, "cpu_ops/"], check=True,
                           capture_output=True, text=True).stdout.split()
    for name in names:
        if name.endswith((".c", ".h")):
            text = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{name}"], check=True,
                                  capture_output=True).stdout
            (out_dir / Path(name).name).write_bytes(text)
    cc = shutil.which("cc") or shutil.which("gcc")
    libs = []
    for stem in ("decoder_stack", "qgemm"):
        target = out_dir / f"{stem}.so"
        subprocess.run([cc, "-O3", f"-march={march}", "-fopenmp", "-shared", "-fPIC", "-std=gnu11", "-o", str(target),
                        str(out_dir / f"{stem}.c"), "-lm"], check=True)
        libs.append(ctypes.CDLL(str(target)))
    return libs[0], libs[1]


def like(lib: ctypes.CDLL, template: ctypes.CDLL, names: tuple[str, ...]) -> ctypes.CDLL:
    for n in names:
        getattr(lib, n).restype = getattr(template, n).restype
        getattr(lib, n).argtypes = getattr(template, n).argtypes
    return lib


def kernel_cycles(old_q: ctypes.CDLL, new_q: ctypes.CDLL, ghz: float) -> dict[str, dict]:
    """qgemm alone on SmolLM2's shapes (random Q4_1 blocks, weights in cache): cycles per (32-weight block,
    row) at ``ghz``, both builds alternated, results compared bit for bit."""
    import numpy as np

    out = {}
    rng = np.random.default_rng(0)
    for m, k, n in ((1, 576, 960), (5, 576, 3072), (8, 576, 960), (32, 576, 3072), (1024, 576, 960),
                    (1024, 576, 3072), (1024, 1536, 576)):
        g = k // 32
        raw = rng.integers(0, 256, (n, g, 20), dtype=np.uint8)
        raw[:, :, 0:2] = np.full((n, g, 1), 0.01, np.float16).view(np.uint8)  # d
        raw[:, :, 2:4] = np.full((n, g, 1), -0.05, np.float16).view(np.uint8)  # m
        w = torch.from_numpy(raw.reshape(n, g * 20)).contiguous()
        x = torch.randn(m, k)
        ys = {"baseline": torch.empty(m, n), "candidate": torch.empty(m, n)}
        spent = {"baseline": 0.0, "candidate": 0.0}
        reps = max(1, int(2e8 / (m * k * n)))
        for rnd in range(4):
            for name, lib in (("baseline", old_q), ("candidate", new_q)):
                c0 = time.thread_time()
                for _ in range(reps):
                    lib.hyspec_qgemm(1, x.data_ptr(), m, k, w.data_ptr(), n, ys[name].data_ptr())
                if rnd:
                    spent[name] += time.thread_time() - c0
        pairs = m * n * g * reps * 3
        out[f"M={m} K={k} N={n}"] = {name: round(t * ghz * 1e9 / pairs, 2) for name, t in spent.items()} | {
            "bit_identical": torch.equal(ys["baseline"], ys["candidate"])}
        print(f"qgemm M={m:5d} K={k:5d} N={n:5d}: cycles per block and row, baseline "
              f"{out[f'M={m} K={k} N={n}']['baseline']:.2f}, candidate {out[f'M={m} K={k} N={n}']['candidate']:.2f}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="0b26a75", help="git revision of the kernels to compare against")
    ap.add_argument("--model", default=None)
    ap.add_argument("--prefill", type=int, default=1024, help="prompt length of the prefill case (0: skip)")
    ap.add_argument("--context", type=int, default=128, help="context of the decode and verification rows")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--kernel-ghz", type=float, default=0.0,
                    help="also time qgemm alone (one thread) and report cycles per block and row at this clock")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from hyspec.assets import default_model
    from hyspec.backends.registry import get_backend
    from hyspec.cpu_ops import qgemm
    from hyspec.kv.pool import KVPool
    from hyspec.kv.sequence_kv import SequenceKV
    from hyspec.model.loader import load_model
    from hyspec.seam.forward import LAST_LOGITS, Feed, ModelRunner

    backend = get_backend("cpu")
    model = backend.optimize_model(load_model(args.model or default_model(), dtype="float32", ops=backend.ops,
                                              backend=backend, quantization=None))
    if getattr(model, "layer_stack", None) is None:
        raise SystemExit("the model does not run on the decoder stack here (no compiler?): nothing to compare")
    new_stack, new_q = model.layer_stack.lib, qgemm.library()
    tmp = Path(tempfile.mkdtemp(prefix="hyspec-rows-"))
    old_stack, old_q = build_baseline(args.baseline, tmp)
    like(old_stack, new_stack, ("hyspec_decoder_stack",))
    like(old_q, new_q, ("hyspec_qgemm", "hyspec_qgemm_isa"))
    kernels = {"baseline": (old_stack, old_q), "candidate": (new_stack, new_q)}
    original_library = qgemm.library

    def use(name: str) -> None:
        stack_lib, q_lib = kernels[name]
        model.layer_stack.lib = stack_lib
        qgemm.library = (lambda lib=q_lib: lib) if name == "baseline" else original_library

    result = {"threads": torch.get_num_threads(), "baseline": args.baseline, "isa": qgemm.isa(new_q), "cases": {}}
    if args.kernel_ghz:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        result["qgemm_cycles_per_block_and_row"] = kernel_cycles(old_q, new_q, args.kernel_ghz)
        torch.set_num_threads(threads)
    cfg = model.config
    batches = [int(b) for b in args.batches.split(",") if b]
    longest = max(args.prefill, args.context + 8)
    page = KVPool.page_bytes_for(cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32, 16)
    pages = max(batches) * ((args.context + 8) // 16 + 2) + args.prefill // 16 + 4
    pool = KVPool(pages, page)
    layout = pool.register("target", cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, torch.float32,
                           16)
    runner = ModelRunner(model, layout, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, cfg.vocab_size, (max(batches), longest), generator=gen).tolist()

    cases = []  # (name, rows per forward, function building the feeds and resetting the caches)
    if args.prefill:
        long_kv = SequenceKV(pool, layout)
        long_kv.reserve(args.prefill)

        def prefill_feeds():
            long_kv.truncate(0)
            long_kv.reserve(args.prefill)
            return [Feed(long_kv, tokens[0][:args.prefill], 0, logits=LAST_LOGITS)]
        cases.append((f"prefill {args.prefill}", args.prefill, prefill_feeds))
    seqs = [SequenceKV(pool, layout) for _ in range(max(batches))]
    for i, kv in enumerate(seqs):  # each sequence's context, computed once (the same for both builds)
        kv.reserve(args.context + 8)
        runner.run([Feed(kv, tokens[i][:args.context], 0, logits=LAST_LOGITS)])

    def rows_feeds(batch: int, n: int):
        def feeds():
            out = []
            for i in range(batch):
                seqs[i].truncate(args.context)
                seqs[i].reserve(args.context + n)
                out.append(Feed(seqs[i], tokens[i][args.context:args.context + n], args.context))
            return out
        return feeds
    for b in batches:
        cases.append((f"decode batch {b}", b, rows_feeds(b, 1)))
    for b in [v for v in (1, 8) if v <= max(batches)]:  # the sequences --batches made room for
        cases.append((f"verify k+1=5 batch {b}", 5 * b, rows_feeds(b, 5)))

    print(f"{torch.get_num_threads()} threads, isa {qgemm.isa(new_q)}; per token: cpu ms / wall ms "
          f"(median of {args.repeats}, interleaved)")
    for name, rows, make in cases:
        cpu = {k: [] for k in kernels}
        wall = {k: [] for k in kernels}
        logits = {}
        for rep in range(args.repeats + 1):
            for which in (kernels if rep % 2 == 0 else reversed(list(kernels))):
                use(which)
                feeds = make()
                c0, t0 = time.process_time(), time.perf_counter()
                out = runner.run(feeds)
                dt_c, dt_w = time.process_time() - c0, time.perf_counter() - t0
                logits[which] = out.logits
                if rep:  # the first round warms caches and pages
                    cpu[which].append(dt_c / rows)
                    wall[which].append(dt_w / rows)
        same = torch.equal(logits["baseline"], logits["candidate"])
        row = {k: {"cpu_ms_per_token": round(statistics.median(cpu[k]) * 1e3, 4),
                   "wall_ms_per_token": round(statistics.median(wall[k]) * 1e3, 4)} for k in kernels}
        row["cpu_speedup"] = round(row["baseline"]["cpu_ms_per_token"] / row["candidate"]["cpu_ms_per_token"], 3)
        row["rows"] = rows
        row["logits_bit_identical"] = same
        result["cases"][name] = row
        print(f"{name:22s} baseline {row['baseline']['cpu_ms_per_token']:8.3f} / "
              f"{row['baseline']['wall_ms_per_token']:8.3f}   candidate {row['candidate']['cpu_ms_per_token']:8.3f} / "
              f"{row['candidate']['wall_ms_per_token']:8.3f}   cpu x{row['cpu_speedup']:.2f}  identical={same}")
    use("candidate")
    shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    identical = [r["logits_bit_identical"] for r in result["cases"].values()]
    identical += [r["bit_identical"] for r in result.get("qgemm_cycles_per_block_and_row", {}).values()]
    return 0 if all(identical) else 1


if __name__ == "__main__":
    sys.exit(main())
