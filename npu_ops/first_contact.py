"""The attention ladder of ``scripts/npu_first_contact.sh``: the smallest documented shape first, then outwards.

Each rung builds one paged-attention step (hyspec.cuda_ops.cases, pure torch),
runs it through the NPU op table that ``hyspec.npu_ops.plan`` chose for the
installed torch_npu, and compares it with the reference op on the host under
the NPU tolerance table.  A rung records the route the wrapper took (ATB PA,
FIA TND, FIA BSND, or the reference and why), the largest error and the
verdict, or the exception a kernel raised; a failing rung does not stop the
ones after it.  On the emulated torch_npu (``--dry-run``) this checks the
plumbing only; on a 910B it is the kernels' first test.
"""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import Any

import torch

#: bf16, D = 128, GQA, block 128 first: inside every documented FIA/PA rule of the pinned release
@dataclass(frozen=True)
class Rung:
    name: str
    dtype: torch.dtype
    heads: tuple[int, int]
    head_dim: int
    block_size: int
    context_lens: tuple[int, ...]
    query_lens: tuple[int, ...]
    tree: bool = False
    sliding_window: int | None = None  # a windowed layer's step: FIA's explicit mask carries the window


LADDER = (
    Rung("bf16 D=128 GQA 8/2 block 128: decode", torch.bfloat16, (8, 2), 128, 128, (40, 300), (1, 1)),
    Rung("bf16 D=128 GQA 8/2 block 128: prefill + chain", torch.bfloat16, (8, 2), 128, 128, (0, 200), (24, 4)),
    Rung("bf16 D=128 GQA 8/2 block 128: tree", torch.bfloat16, (8, 2), 128, 128, (20, 150), (8, 13), tree=True),
    Rung("bf16 D=128 GQA 8/2 block 128: tree > 16 rows (split)", torch.bfloat16, (8, 2), 128, 128, (60,), (40,),
         tree=True),
    Rung("bf16 D=64 GQA 9/3 block 128 (SmolLM2): decode", torch.bfloat16, (9, 3), 64, 128, (70, 5), (1, 1)),
    Rung("bf16 D=64 GQA 9/3 block 128 (SmolLM2): prefill + chain", torch.bfloat16, (9, 3), 64, 128, (0, 260),
         (40, 5)),
    Rung("bf16 D=64 GQA 9/3 block 128 (SmolLM2): tree", torch.bfloat16, (9, 3), 64, 128, (33, 140), (9, 16),
         tree=True),
    Rung("fp16 D=128 MHA 8/8 block 128: prefill + tree", torch.float16, (8, 8), 128, 128, (0, 90), (30, 6),
         tree=True),
    Rung("bf16 D=128 GQA 8/2 block 512: prefill + chain", torch.bfloat16, (8, 2), 128, 512, (0, 700), (64, 4)),
    Rung("bf16 D=128 GQA 8/2 block 16: decode (PA's 16-aligned rule)", torch.bfloat16, (8, 2), 128, 16, (50, 3),
         (1, 1)),
    Rung("bf16 D=128 GQA 8/2 block 128: decode, window 64", torch.bfloat16, (8, 2), 128, 128, (40, 300), (1, 1),
         sliding_window=64),
    Rung("bf16 D=128 GQA 8/2 block 128: prefill + chain, window 16", torch.bfloat16, (8, 2), 128, 128, (0, 200),
         (24, 4), sliding_window=16),
    Rung("bf16 D=64 GQA 9/3 block 128: tree, window 5", torch.bfloat16, (9, 3), 64, 128, (33, 140), (9, 16),
         tree=True, sliding_window=5),
)


def run_ladder(device: torch.device | str | None = None) -> list[dict[str, Any]]:
    """Every rung on the installed torch_npu's attention op; one dict per rung (see the module doc)."""
    from hyspec.conformance.op_cases import paged_case_to
    from hyspec.cuda_ops.cases import paged_attention_case
    from hyspec.npu_ops import build_ops
    from hyspec.npu_ops.detect import import_torch_npu
    from hyspec.npu_ops.layout import paged_cache
    from hyspec.npu_ops.plan import plan
    from hyspec.npu_ops.tolerances import tolerance
    from hyspec.ops import reference_ops

    module = import_torch_npu()
    p = plan(module, device)
    device = torch.device(device) if device is not None else (torch.device("cpu") if getattr(
        module, "HYSPEC_EMULATION", None) else torch.device("npu", 0))
    attention = build_ops(p).get("attention")
    reference = reference_ops()
    results = []
    for i, rung in enumerate(LADDER):
        row: dict[str, Any] = {"rung": rung.name}
        started = time.perf_counter()
        try:
            case = paged_attention_case(list(rung.context_lens), list(rung.query_lens), *rung.heads, rung.head_dim,
                                        rung.block_size, rung.dtype, tree=rung.tree, seed=100 + i)
            window = {} if rung.sliding_window is None else {"sliding_window": rung.sliding_window}
            expected = reference.attention(*case.args(), **window)
            if attention is None:
                row.update(route="reference", why="no torch_npu attention function is usable", passed=None)
            else:
                args = paged_case_to(case, device)
                row["route"], why = attention.route(args[0], paged_cache(args[1], args[2]), args[3],
                                                    rung.sliding_window)
                if why:
                    row["why"] = why
                actual = attention(*args, **window).cpu()
                check = tolerance("attention", rung.dtype)
                row["max_error"] = float((actual.float() - expected.float()).abs().max())
                check.check(actual, expected, rung.name)
                row["passed"] = True
        except AssertionError as exc:
            row.update(passed=False, error=str(exc).splitlines()[0][:300])
        except Exception as exc:  # a kernel's refusal or fault: recorded, the next rung still runs
            row.update(passed=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                       traceback=traceback.format_exc(limit=4)[-1500:])
        row["seconds"] = round(time.perf_counter() - started, 3)
        results.append(row)
    return results


def probe_band_mode(device: torch.device | str | None = None, window: int = 16) -> dict[str, Any]:
    """Which ``pre_tokens`` makes FIA's band mode (sparse_mode 4, TND, ``next_tokens=0``) hyspec's window ``w``.

    The FIA doc states the band but not its anchoring or inclusivity, so hyspec carries windows in explicit
    masks (hyspec.npu_ops.attention_args); vllm-ascend passes ``pre_tokens=w`` (vllm_ascend/attention/
    attention_v1.py at 182b75ea84).  This calls the band with ``w - 1`` and ``w`` on one prefill + chain step
    and reports each one's largest error against the reference window: the faster route can be adopted once
    a 910B says which is exact.  The emulation refuses the band (undocumented), so a dry run records that.
    """
    from hyspec.conformance.op_cases import paged_case_to
    from hyspec.cuda_ops.cases import paged_attention_case
    from hyspec.npu_ops.attention_args import causal_args, causal_mask
    from hyspec.npu_ops.detect import import_torch_npu
    from hyspec.npu_ops.layout import paged_cache
    from hyspec.ops import reference_ops

    module = import_torch_npu()
    device = torch.device(device) if device is not None else (torch.device("cpu") if getattr(
        module, "HYSPEC_EMULATION", None) else torch.device("npu", 0))
    case = paged_attention_case([0, 200], [24, 4], 8, 2, 128, 128, torch.bfloat16, seed=7)
    expected = reference_ops().attention(*case.args(), sliding_window=window).float()
    q, k_cache, v_cache, meta, scale = paged_case_to(case, device)
    cache = paged_cache(k_cache, v_cache)
    args = causal_args(meta, cache)
    result: dict[str, Any] = {"window": window, "next_tokens": 0}
    for pre_tokens in (window - 1, window):
        try:
            out, _ = module.npu_fused_infer_attention_score(
                q.contiguous(), cache.key_bsh(), cache.value_bsh(), atten_mask=causal_mask(q.device),
                block_table=args.block_table, input_layout="TND", block_size=cache.block_size,
                actual_seq_lengths=args.actual_seq_lengths, actual_seq_lengths_kv=args.actual_seq_lengths_kv,
                num_heads=q.shape[1], num_key_value_heads=cache.key.shape[2], scale=scale, sparse_mode=4,
                pre_tokens=pre_tokens, next_tokens=0)
            result[f"pre_tokens={pre_tokens}"] = {"max_error": float((out.cpu().float() - expected).abs().max())}
        except Exception as exc:  # a refusal (the emulation, an older release) is the answer for this value
            result[f"pre_tokens={pre_tokens}"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    return result


__all__ = ["LADDER", "Rung", "probe_band_mode", "run_ladder"]
