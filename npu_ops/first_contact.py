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
            expected = reference.attention(*case.args())
            if attention is None:
                row.update(route="reference", why="no torch_npu attention function is usable", passed=None)
            else:
                args = paged_case_to(case, device)
                row["route"], why = attention.route(args[0], paged_cache(args[1], args[2]), args[3])
                if why:
                    row["why"] = why
                actual = attention(*args).cpu()
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


__all__ = ["LADDER", "Rung", "run_ladder"]
