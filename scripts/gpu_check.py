"""Correctness and speed of hyspec's Triton kernels against the reference ops, on one NVIDIA GPU.

    python scripts/gpu_check.py [--out results.json]     # on a CUDA machine, a few minutes at most
    python scripts/gpu_check.py --dry-run                # CPU, TRITON_INTERPRET=1, tiny sizes

1. Correctness: every kernel against its reference on CUDA tensors at
   Llama-8B-like sizes (32 query / 8 KV heads of 128; batches 1-64; contexts
   1k-8k; draft trees of 16-64 nodes; prefill), within the per-dtype tolerance
   of ``hyspec.cuda_ops.tolerances``; plus the docs/architecture.md §4 check that a chain
   verified in one step equals the same tokens decoded one by one, bitwise.
2. Speed: median of CUDA-event timings (after warm-up, with L2 flushed
   before each run) for kernel and reference; achieved GB/s = ideal bytes
   (every input read once, every output written once) / time, against the
   card's HBM peak; TFLOP/s for attention; then a small sweep of attention
   tile configs.

Every case runs in its own try block, so one failure (a kernel that does not
compile on this card, say) is recorded and the rest still run.  Prints a table
and writes JSON to ``--out``, else ``$OUT/gpu_check.json``, else
``./gpu_check.json``.  Exit status 1 when any correctness check failed.

hyspec need not be installed: run from a checkout, the script maps the
package onto its folders (``hyspec`` -> core/, ``hyspec.cuda_ops`` ->
cuda_ops/, ...) itself; torch and triton must be there.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

#: HBM peak bandwidth (GB/s) by a substring of torch.cuda.get_device_name(); first match wins.
PEAK_GBPS = (
    ("H200", 4800), ("H100 NVL", 3900), ("H100 PCIe", 2000), ("H100", 3350), ("H800", 3350),
    ("A100-SXM4-80GB", 2039), ("A100 80GB PCIe", 1935), ("A100", 1555), ("L40S", 864), ("L40", 864),
    ("A10G", 600), ("A10", 600), ("RTX 4090", 1008), ("RTX 3090", 936), ("V100", 900), ("L4", 300), ("T4", 320),
)


REPO = Path(__file__).resolve().parents[1]


def ensure_hyspec_importable() -> None:
    """Import hyspec from this checkout when it is not installed (pyproject's package-dir, by hand).

    ``hyspec``'s search path is core/ and then the repository root, so
    ``hyspec.ops`` resolves to core/ops and ``hyspec.cuda_ops`` to cuda_ops/.
    """
    if importlib.util.find_spec("hyspec") is not None:
        return
    spec = importlib.util.spec_from_file_location(
        "hyspec", REPO / "core" / "__init__.py", submodule_search_locations=[str(REPO / "core"), str(REPO)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["hyspec"] = module
    spec.loader.exec_module(module)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default $OUT/gpu_check.json)")
    parser.add_argument("--dry-run", action="store_true",
                        help="run on the CPU under TRITON_INTERPRET=1 at tiny sizes (checks the script itself)")
    parser.add_argument("--reps", type=int, default=20, help="timed runs per measurement (median reported)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs before timing")
    parser.add_argument("--budget-s", type=float, default=210.0,
                        help="skip remaining timings and the sweep once this much time has passed")
    parser.add_argument("--no-sweep", action="store_true", help="skip the attention config sweep")
    parser.add_argument("--inner", type=int, default=10,
                        help="calls between one pair of CUDA events (a single call's events time the host)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0 or args.budget_s <= 0 or args.inner < 1:
        parser.error("--reps and --inner must be >= 1, --warmup >= 0 and --budget-s > 0")
    return args


def output_path(args: argparse.Namespace) -> Path:
    if args.out is not None:
        return args.out
    return Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else Path("gpu_check.json")


def plan(dry_run: bool) -> dict[str, Any]:
    """Case sizes: realistic on the GPU, tiny under the interpreter."""
    if dry_run:
        return dict(
            heads=(4, 2, 32),
            attention=[  # (name, context_lens, query_lens, tree, block_size, dtype name)
                ("decode_bs2", [70, 40], [1, 1], False, 16, "bfloat16"),
                ("tree_bs1_n6", [20], [6], True, 16, "bfloat16"),
                ("prefill_bs1_n20", [0], [20], False, 16, "float32"),
                ("tree_bs2_n6_window20", [70, 30], [1, 6], True, 16, "bfloat16", 20),
            ],
            chain=(70, 4), tokens=(8, 33), moves=5, hidden=64,
            verify=[("trees_bs3_n5_v40_q", 3, 5, 40, True), ("chains_bs2_n4_v1500", 2, 4, 1500, False)],
            sweep_cases=["decode_bs2"], sweep=[dict(block_m=32, block_n=32, partition_size=64)],
            config=dict(block_m=32, block_n=32, partition_size=64),
        )

    def ragged(ctx: int, batch: int) -> list[int]:  # contexts spread over [3/4 ctx, ctx]
        return [ctx - (b * 97) % max(ctx // 4, 1) for b in range(batch)]

    return dict(
        heads=(32, 8, 128),
        attention=[
            ("decode_bs1_ctx1k", [1024], [1], False, 16, "bfloat16"),
            ("decode_bs1_ctx8k", [8192], [1], False, 16, "bfloat16"),
            ("decode_bs8_ctx4k_page32", ragged(4096, 8), [1] * 8, False, 32, "bfloat16"),
            ("decode_bs64_ctx2k", ragged(2048, 64), [1] * 64, False, 16, "bfloat16"),
            ("decode_bs64_ctx8k", ragged(8192, 64), [1] * 64, False, 16, "bfloat16"),
            ("chain_bs8_n8_ctx4k", ragged(4096, 8), [8] * 8, False, 16, "bfloat16"),
            ("tree_bs1_n64_ctx8k", [8192], [64], True, 16, "bfloat16"),
            ("tree_bs16_n16_ctx2k", ragged(2048, 16), [16] * 16, True, 16, "bfloat16"),
            ("tree_bs64_n64_ctx1k", ragged(1024, 64), [64] * 64, True, 16, "bfloat16"),
            ("prefill_bs1_n2048", [0], [2048], False, 16, "bfloat16"),
            ("prefill_bs4_n512_ctx1k", [1024] * 4, [512] * 4, False, 16, "bfloat16"),
            ("decode_bs8_ctx2k_fp16", ragged(2048, 8), [1] * 8, False, 16, "float16"),
            ("tree_bs4_n16_ctx1k_fp32", ragged(1024, 4), [16] * 4, True, 16, "float32"),
            # sliding windows (a 7th field): keys before a program's window are skipped, so these read O(w)
            ("decode_bs8_ctx8k_window1k", ragged(8192, 8), [1] * 8, False, 16, "bfloat16", 1024),
            ("tree_bs16_n16_ctx4k_window512", ragged(4096, 16), [16] * 16, True, 16, "bfloat16", 512),
            ("prefill_bs1_n4096_window1k", [0], [4096], False, 16, "bfloat16", 1024),
        ],
        chain=(3000, 8), tokens=(64, 4096), moves=512, hidden=4096,
        verify=[  # (name, sequences, nodes per tree, vocab, drafts sampled from stored q rows)
            ("trees_bs64_n64_v128k_onehot", 64, 64, 128256, False),
            ("trees_bs16_n16_v128k_q", 16, 16, 128256, True),
            ("chains_bs64_n8_v32k_q", 64, 8, 32000, True),
        ],
        sweep_cases=["decode_bs8_ctx4k_page32", "tree_bs16_n16_ctx2k"],
        sweep=[dict(block_m=16), dict(block_m=64, num_warps=8), dict(block_n=64),
               dict(block_m=64, block_n=64, num_warps=8), dict(partition_size=256), dict(partition_size=1024)],
        config=None,
    )


class Checker:
    """Runs cases, keeps results, never lets one failure stop the rest."""

    def __init__(self, args: argparse.Namespace, torch: Any, device: Any):
        self.args, self.torch, self.device = args, torch, device
        self.start = time.perf_counter()
        self.correctness: list[dict] = []
        self.timing: list[dict] = []
        self.errors: list[dict] = []
        self.context_lost: str | None = None  # a sticky CUDA error: nothing more can run in this process
        self.report_base: dict = {}
        self.consistency: dict = {}
        self.peak_gbps = self._peak()
        # Evicts L2 (H200: 60 MB) between timed runs so small working sets are not timed from cache.
        self.flush = torch.empty(256 << 20 if device.type == "cuda" else 1, dtype=torch.uint8, device=device)

    def _peak(self) -> float | None:
        if self.device.type != "cuda":
            return None
        name = self.torch.cuda.get_device_name(self.device)
        return next((float(gbps) for key, gbps in PEAK_GBPS if key in name), None)

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def guarded(self, op: str, case: str, fn: Callable[[], None]) -> None:
        """Run one case; record its error; write the report so far.  Never raises.

        After a sticky CUDA error (an illegal address, a failed launch) every later CUDA call raises,
        ``empty_cache`` included: the rest is recorded as skipped instead of aborting the run and
        losing what was measured.
        """
        if self.context_lost:
            self.errors.append(dict(op=op, case=case, skipped=f"CUDA context lost earlier: {self.context_lost}"))
            self.write()
            return
        try:
            fn()
            if self.device.type == "cuda":
                self.torch.cuda.synchronize()  # an asynchronous fault surfaces here, charged to this case
        except Exception as exc:  # noqa: BLE001 - recorded and reported, the run goes on
            self.errors.append(dict(op=op, case=case, error=repr(exc)[:2000],
                                    traceback=traceback.format_exc(limit=6)[-4000:]))
            print(f"ERROR {op} {case}: {exc!r}"[:400], flush=True)
        if self.device.type == "cuda":
            try:
                self.torch.cuda.empty_cache()
                self.torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - the sticky-error case
                self.context_lost = f"{op} {case}: {exc!r}"[:400]
                print(f"CUDA context lost after {op} {case}: later cases are skipped", flush=True)
        self.write()

    def report(self) -> dict:
        return dict(self.report_base, correctness=self.correctness, consistency=self.consistency,
                    timing=self.timing, errors=self.errors, context_lost=self.context_lost,
                    elapsed_s=self.elapsed())

    def write(self) -> None:
        """The report so far, after every case: a hang or a crash later loses nothing before it."""
        path = output_path(self.args)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.report(), indent=1))

    def compare(self, op: str, case: str, actual: Any, expected: Any, dtype: Any) -> None:
        from hyspec.cuda_ops.tolerances import EXACT, tolerance

        tol = EXACT if op == "rejection_sample" else tolerance(op, dtype)  # token ids: exact
        pairs = list(zip(actual, expected)) if isinstance(actual, tuple) else [(actual, expected)]
        excess = max(tol.excess(a, e) for a, e in pairs)
        max_abs = max(float((a.double() - e.double()).abs().max()) if a.numel() else 0.0 for a, e in pairs)
        shapes_ok = all(a.shape == e.shape and a.dtype == e.dtype for a, e in pairs)
        self.correctness.append(dict(op=op, case=case, dtype=str(dtype).replace("torch.", ""),
                                     passed=bool(shapes_ok and excess <= 1.0), excess=excess,
                                     max_abs_diff=max_abs, atol=tol.atol, rtol=tol.rtol))

    def median_ms(self, fn: Callable[[], Any]) -> float:
        torch = self.torch
        for _ in range(self.args.warmup):
            fn()
        times = []
        for _ in range(self.args.reps):
            if self.device.type == "cuda":
                # events around `inner` back-to-back calls: around one call they time the host's launch
                # latency as much as the kernel.  The L2 flush precedes the batch (later calls may hit L2).
                self.flush.zero_()
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(self.args.inner):
                    fn()
                end.record()
                end.synchronize()
                times.append(begin.elapsed_time(end) / self.args.inner)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def time(self, op: str, case: str, kernel: Callable[[], Any], reference: Callable[[], Any] | None,
             nbytes: int, flops: int | None = None, **extra: Any) -> None:
        if self.elapsed() > self.args.budget_s:
            self.timing.append(dict(op=op, case=case, skipped="time budget spent"))
            return
        kernel_ms = self.median_ms(kernel)
        reference_ms = self.median_ms(reference) if reference is not None else None
        gbps = nbytes / (kernel_ms * 1e-3) / 1e9
        self.timing.append(dict(
            op=op, case=case, kernel_ms=kernel_ms, reference_ms=reference_ms,
            speedup=reference_ms / kernel_ms if reference_ms else None, bytes=nbytes, gbps=gbps,
            pct_peak=100 * gbps / self.peak_gbps if self.peak_gbps else None,
            tflops=flops / (kernel_ms * 1e-3) / 1e12 if flops else None, **extra))


def attention_work(meta: Any, hq: int, hkv: int, d: int, elem: int, window: int | None = None) -> tuple[int, int]:
    """(ideal bytes, flops): KV of every sequence read once, q read and out written once; 4*d per visible pair.
    With a window: the last ``window + n - 1`` keys of a sequence, and the pairs its visibility mask leaves."""
    qo_bytes = meta.num_tokens * hq * d * 2 * elem
    if window is not None:
        from hyspec.ops.attention import visibility_mask

        keys = sum(min(length, window + n - 1) for n, length in zip(meta.query_lens, meta.seq_lens_host))
        mask = visibility_mask(meta, meta.seq_lens.device, window)
        pairs = sum(int(mask[b, :n].sum()) for b, n in enumerate(meta.query_lens))
        return keys * hkv * d * 2 * elem + qo_bytes, 4 * hq * d * pairs
    kv_bytes = sum(meta.seq_lens_host) * hkv * d * 2 * elem
    pairs = 0
    for b, (n, length) in enumerate(zip(meta.query_lens, meta.seq_lens_host)):
        ctx = length - n
        if meta.tree_mask is None:
            pairs += n * ctx + n * (n + 1) // 2
        else:
            start = int(meta.query_start_loc[b])
            pairs += n * ctx + int(meta.tree_mask[start:start + n].sum())
    return kv_bytes + qo_bytes, 4 * hq * d * pairs


def check_attention(chk: Checker, spec: dict, torch: Any) -> None:
    from hyspec.cuda_ops.attention import AttentionConfig, triton_paged_attention
    from hyspec.cuda_ops.cases import paged_attention_case
    from hyspec.ops import reference_ops

    ref = reference_ops()
    hq, hkv, d = spec["heads"]
    config = AttentionConfig(**spec["config"]) if spec["config"] else None
    cases = {}
    for name, ctx, qlens, tree, block_size, dtype_name, *window in spec["attention"]:
        def one(name=name, ctx=ctx, qlens=qlens, tree=tree, block_size=block_size, dtype_name=dtype_name,
                window=window[0] if window else None) -> None:
            dtype = getattr(torch, dtype_name)
            case = paged_attention_case(ctx, qlens, hq, hkv, d, block_size, dtype, tree=tree, device=chk.device)
            expected = ref.attention(*case.args(), sliding_window=window)
            actual = triton_paged_attention(*case.args(), sliding_window=window, config=config)
            chk.compare("attention", name, actual, expected, dtype)
            del expected, actual
            nbytes, flops = attention_work(case.meta, hq, hkv, d, case.q.element_size(), window)
            chk.time("attention", name,
                     lambda: triton_paged_attention(*case.args(), sliding_window=window, config=config),
                     lambda: ref.attention(*case.args(), sliding_window=window), nbytes, flops)
            if name in spec["sweep_cases"]:
                cases[name] = (case, nbytes, flops)
        chk.guarded("attention", name, one)

    if chk.args.no_sweep:
        return
    for name, (case, nbytes, flops) in cases.items():
        for overrides in spec["sweep"]:
            label = f"{name} " + ",".join(f"{k}={v}" for k, v in overrides.items())

            def sweep_one(case=case, overrides=overrides, label=label, nbytes=nbytes, flops=flops) -> None:
                cfg = AttentionConfig(**{**(spec["config"] or {}), **overrides})
                chk.time("attention_sweep", label, lambda: triton_paged_attention(*case.args(), config=cfg),
                         None, nbytes, flops, config=overrides)
            chk.guarded("attention_sweep", label, sweep_one)


def check_chain_consistency(chk: Checker, spec: dict, torch: Any) -> dict:
    """docs/architecture.md §4: each token of a verified chain equals its one-token decode, bit for bit."""
    from hyspec.cuda_ops.attention import AttentionConfig, triton_paged_attention
    from hyspec.cuda_ops.cases import paged_attention_case
    from hyspec.ops.attention import AttentionMetadata

    hq, hkv, d = spec["heads"]
    ctx, n = spec["chain"]
    config = AttentionConfig(**spec["config"]) if spec["config"] else None
    case = paged_attention_case([ctx], [n], hq, hkv, d, 16, torch.bfloat16, device=chk.device)
    batched = triton_paged_attention(*case.args(), config=config)
    m = case.meta
    diffs = []
    for i in range(n):
        alone = AttentionMetadata(
            query_start_loc=torch.tensor([0, 1], dtype=torch.int32, device=chk.device),
            seq_lens=torch.tensor([ctx + i + 1], dtype=torch.int32, device=chk.device),
            block_tables=m.block_tables, slot_mapping=m.slot_mapping[i:i + 1], positions=m.positions[i:i + 1],
            tree_mask=None, query_lens=[1], seq_lens_host=[ctx + i + 1])
        single = triton_paged_attention(case.q[i:i + 1], case.k_cache, case.v_cache, alone, case.scale,
                                        config=config)
        diffs.append(float((single[0].float() - batched[i].float()).abs().max()))
    return dict(context=ctx, tokens=n, bitwise_equal=all(x == 0.0 for x in diffs), max_abs_diff=max(diffs))


def check_small_ops(chk: Checker, spec: dict, torch: Any) -> None:
    from hyspec.cuda_ops.kv import triton_compact_kv, triton_write_kv
    from hyspec.cuda_ops.norm import triton_rms_norm
    from hyspec.cuda_ops.rotary import triton_rotary
    from hyspec.ops import reference_ops

    ref = reference_ops()
    hq, hkv, d = spec["heads"]
    dev, bf16 = chk.device, torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape: int, dtype: Any = bf16) -> Any:
        return torch.randn(*shape, generator=g, device=dev).to(dtype)

    for tokens in spec["tokens"]:
        block_size = 16
        num_blocks = tokens // block_size + 8
        pool = randn(num_blocks, 2, 2, block_size, hkv, d)  # [blocks, layers, k|v, block_size, Hkv, D]
        row_bytes = hkv * d * pool.element_size()

        def write(tokens=tokens, pool=pool, row_bytes=row_bytes) -> None:
            k, v = randn(tokens, hkv, d), randn(tokens, hkv, d)
            slots = torch.randperm(num_blocks * block_size, device=dev, generator=g)[:tokens]
            expected = pool.clone()
            ref.write_kv(k, v, expected[:, 1, 0], expected[:, 1, 1], slots)
            actual = pool.clone()
            triton_write_kv(k, v, actual[:, 1, 0], actual[:, 1, 1], slots)
            chk.compare("write_kv", f"T{tokens}", actual, expected, bf16)
            chk.time("write_kv", f"T{tokens}", lambda: triton_write_kv(k, v, pool[:, 1, 0], pool[:, 1, 1], slots),
                     lambda: ref.write_kv(k, v, pool[:, 1, 0], pool[:, 1, 1], slots), 4 * tokens * row_bytes)
        chk.guarded("write_kv", f"T{tokens}", write)

        def rms(tokens=tokens) -> None:
            x, res, w = randn(tokens, spec["hidden"]), randn(tokens, spec["hidden"]), randn(spec["hidden"])
            chk.compare("rms_norm", f"rows{tokens}+res", triton_rms_norm(x, w, 1e-6, res)[0],
                        ref.rms_norm(x, w, 1e-6, res)[0], bf16)
            chk.compare("rms_norm", f"rows{tokens}", triton_rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), bf16)
            chk.time("rms_norm", f"rows{tokens}+res", lambda: triton_rms_norm(x, w, 1e-6, res),
                     lambda: ref.rms_norm(x, w, 1e-6, res), 4 * x.numel() * x.element_size())
        chk.guarded("rms_norm", f"rows{tokens}", rms)

        def rope(tokens=tokens) -> None:
            q, k = randn(tokens, hq, d), randn(tokens, hkv, d)
            positions = torch.randint(0, 8192, (tokens,), device=dev, generator=g)
            table = randn(8192, d, dtype=torch.float32)
            chk.compare("rotary", f"T{tokens}", triton_rotary(q, k, positions, table),
                        ref.rotary(q, k, positions, table), bf16)
            chk.time("rotary", f"T{tokens}", lambda: triton_rotary(q, k, positions, table),
                     lambda: ref.rotary(q, k, positions, table),
                     2 * (q.numel() + k.numel()) * q.element_size() + tokens * d * 4)
        chk.guarded("rotary", f"T{tokens}", rope)

    def compact() -> None:
        moves = spec["moves"]
        block_size, num_blocks = 16, spec["moves"] // 4 + 8
        pool = randn(num_blocks, 2, 2, block_size, hkv, d)
        src = torch.randperm(num_blocks * block_size, device=dev, generator=g)[:moves]
        dst = src.roll(1)  # every destination is another move's source: overlaps everywhere
        expected, actual = pool.clone(), pool.clone()
        ref.compact_kv(expected[:, 1, 0], expected[:, 1, 1], src, dst)
        triton_compact_kv(actual[:, 1, 0], actual[:, 1, 1], src, dst)
        chk.compare("compact_kv", f"M{moves}", actual, expected, bf16)
        chk.time("compact_kv", f"M{moves}", lambda: triton_compact_kv(pool[:, 1, 0], pool[:, 1, 1], src, dst),
                 lambda: ref.compact_kv(pool[:, 1, 0], pool[:, 1, 1], src, dst),
                 4 * moves * hkv * d * pool.element_size())
    chk.guarded("compact_kv", f"M{spec['moves']}", compact)


def check_verifier(chk: Checker, spec: dict, torch: Any) -> None:
    """Fused rejection sampler vs the reference (host loop over levels and ranks): same node, same token."""
    from hyspec.cuda_ops.verify import triton_rejection_sample
    from hyspec.ops.rejection import rejection_sample
    from hyspec.seam.tree import TreeBatch

    dev = chk.device
    for name, batch, nodes, vocab, sampled in spec["verify"]:
        def one(batch=batch, nodes=nodes, vocab=vocab, sampled=sampled, name=name) -> None:
            g = torch.Generator(device=dev).manual_seed(nodes)
            parents = torch.full((batch, nodes), -1, dtype=torch.int64)
            for i in range(1, nodes):  # chains for "chains_*", else random shapes (shared by the batch)
                parents[:, i] = i - 1 if name.startswith("chains") else int(torch.randint(0, i, (1,)))
            rows = batch * nodes
            # Peaked target rows so that drafts taken from them are mostly accepted (deep walks).
            target = torch.softmax(torch.randn(rows, vocab, generator=g, device=dev) * 4, dim=-1)
            q = None
            if sampled:
                q = torch.softmax(torch.randn(batch, nodes, vocab, generator=g, device=dev) * 4, dim=-1)
            # Each draft drawn from the target's p at its parent (packed row b * nodes + parent).
            parent_rows = (torch.arange(batch)[:, None] * nodes + parents.clamp(min=0)).flatten().to(dev)
            tokens = torch.multinomial(target[parent_rows], 1, generator=g).view(batch, nodes)
            trees = TreeBatch(tokens, parents.to(dev), torch.full((batch,), nodes, device=dev), q, vocab)
            uniforms = torch.rand(batch, nodes, generator=g, device=dev, dtype=torch.float64)
            chk.compare("rejection_sample", name, triton_rejection_sample(target, trees, uniforms),
                        rejection_sample(target, trees, uniforms), torch.float32)
            nbytes = target.numel() * 4 + (q.numel() * 4 if q is not None else 0)  # upper bound: all rows
            chk.time("rejection_sample", name, lambda: triton_rejection_sample(target, trees, uniforms),
                     lambda: rejection_sample(target, trees, uniforms), nbytes)
        chk.guarded("rejection_sample", name, one)


def print_table(report: dict) -> None:
    print(f"\n{report['device']}  peak {report['peak_gbps']} GB/s  torch {report['torch']}  "
          f"triton {report['triton']}  {report['elapsed_s']:.0f}s")
    print(f"{'op':<12} {'case':<28} {'dtype':<9} {'ok':<4} {'excess':>7} {'max|d|':>9}")
    for r in report["correctness"]:
        print(f"{r['op']:<12} {r['case']:<28} {r['dtype']:<9} {'yes' if r['passed'] else 'NO':<4} "
              f"{r['excess']:>7.3f} {r['max_abs_diff']:>9.2e}")
    print(f"\n{'op':<16} {'case':<46} {'kern ms':>8} {'ref ms':>8} {'speedup':>7} {'GB/s':>7} {'%peak':>6} "
          f"{'TFLOP/s':>7}")

    def fmt(value: Any, spec: str) -> str:
        return "-" if value is None else format(value, spec)
    for r in report["timing"]:
        if "skipped" in r:
            print(f"{r['op']:<16} {r['case']:<46} skipped: {r['skipped']}")
            continue
        print(f"{r['op']:<16} {r['case']:<46} {r['kernel_ms']:>8.3f} {fmt(r['reference_ms'], '8.3f'):>8} "
              f"{fmt(r['speedup'], '7.2f'):>7} {r['gbps']:>7.0f} {fmt(r['pct_peak'], '6.1f'):>6} "
              f"{fmt(r['tflops'], '7.1f'):>7}")
    print(f"\nchain == decode bitwise: {report['consistency']}")
    for e in report["errors"]:
        print(f"ERROR {e['op']} {e['case']}: {e['error'][:300]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # must precede the kernel modules' import of triton's jit
    ensure_hyspec_importable()
    import torch
    import triton

    if args.dry_run:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        print("gpu_check: no CUDA device here; use --dry-run to check the script on the CPU", file=sys.stderr)
        return 2
    spec = plan(args.dry_run)
    chk = Checker(args, torch, device)
    chk.report_base = dict(
        device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (TRITON_INTERPRET=1)",
        peak_gbps=chk.peak_gbps, torch=torch.__version__, triton=triton.__version__, dry_run=args.dry_run,
        heads=dict(zip(("num_q_heads", "num_kv_heads", "head_dim"), spec["heads"])),
        bytes_note="ideal bytes: each input element read once, each output element written once",
    )
    chk.write()
    chk.guarded("consistency", "chain_vs_decode",
                lambda: chk.consistency.update(check_chain_consistency(chk, spec, torch)))
    check_small_ops(chk, spec, torch)
    check_attention(chk, spec, torch)
    check_verifier(chk, spec, torch)  # last: a hang here must not cost the attention results
    report = chk.report()
    chk.write()
    print_table(report)
    print(f"\nwrote {output_path(args)}")
    failed = [r for r in chk.correctness if not r["passed"]]
    return 1 if failed or chk.errors or not chk.consistency.get("bitwise_equal", False) else 0


if __name__ == "__main__":
    sys.exit(main())
