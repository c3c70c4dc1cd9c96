"""Fused stochastic verifier: recursive rejection sampling over draft trees in one launch.

Matches ``hyspec.ops.rejection.rejection_sample`` (read its docstring
for why the algorithm is lossless).  The reference loops over depth levels and
sibling ranks on the host, launching a handful of torch ops per iteration (and
synchronising on ``.any()`` / ``.nonzero()``); here one program per sequence
walks its own tree on the device, so a verification step is one launch whatever
the tree shape.  Chains are trees whose nodes have one child each.

Per program: the residual ``p_cur`` lives in a ``[B, V]`` fp32 scratch row and
its mass in an fp64 register, exactly as the reference keeps them; the
acceptance test is the same product ``u * q(x) * mass < p_cur(x)`` in fp64, the
residual the same fp32 ``max(0, p_cur - fp32(mass) * q)``, the final token the
same inverse CDF accumulated in fp64.  Only summation order differs (blocked
sums and scans instead of torch's), i.e. the last bits of fp64 masses: token ids
can differ only when a uniform falls within ~1e-16 of a decision boundary.

The greedy verifier is not a kernel: at temperature 0 verification is an argmax
per row plus two gathers (``hyspec.spec.verify_greedy``), already one pass over
the logits in torch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from hyspec.cuda_ops.common import KernelInputError, check_device, next_power_of_2

#: Residual mass below this is rounding noise, not a distribution (as in the reference).
TINY = 1e-30
#: Vocabulary elements a program handles per loop iteration.
MAX_BLOCK_V = 1024


@triton.jit
def _copy_row_sum(src, dst, V, BLOCK_V: tl.constexpr):
    """dst[:V] = src[:V]; returns sum(src) in fp64."""
    acc = tl.zeros([BLOCK_V], dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        x = tl.load(src + offs, mask=m, other=0.0)
        tl.store(dst + offs, x, mask=m)
        acc += x.to(tl.float64)
    return tl.sum(acc, axis=0)


@triton.jit
def _rejection_sample_kernel(
    probs_ptr, stride_p,  # [T, V] fp32 target p after every node (packed)
    packed_ptr, children_ptr, tokens_ptr,  # [B, N], [B, N, C], [B, N] int64
    q_ptr,  # [B, N, V] fp32 draft q of every node (unused without HAS_Q)
    u_ptr,  # [B, N] fp64 uniforms
    scratch_ptr,  # [B, V] fp32 residual p_cur
    cur_out_ptr, tok_out_ptr,  # [B] int64
    V, N, C, max_depth,
    TINY_MASS: tl.constexpr, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    pc = scratch_ptr + b * V
    row = tl.load(packed_ptr + b * N)
    mass = _copy_row_sum(probs_ptr + row * stride_p, pc, V, BLOCK_V)
    cur = b * 0  # int64 scalars (a Python int would be a constexpr and could not be reassigned)
    live = b * 0 + 1
    for _depth in range(0, max_depth):
        chosen = b * 0 - 1
        if live != 0:
            for rank in range(0, C):
                child = tl.load(children_ptr + (b * N + cur) * C + rank)
                if (chosen < 0) & (child >= 0):
                    x = tl.load(tokens_ptr + b * N + child)
                    p_x = tl.load(pc + x).to(tl.float64)
                    u = tl.load(u_ptr + b * N + child)
                    if HAS_Q:
                        q_row = q_ptr + (b * N + child) * V
                        q_x = tl.load(q_row + x).to(tl.float64)
                    else:
                        q_x = p_x * 0.0 + 1.0
                    # Accept with min(1, (p_cur(x) / mass) / q(x)); no division, so q(x) = 0 is safe.
                    if u * q_x * mass < p_x:
                        chosen = child
                    else:
                        if HAS_Q:
                            mass32 = mass.to(tl.float32)
                            acc = tl.zeros([BLOCK_V], dtype=tl.float64)
                            for start in range(0, V, BLOCK_V):
                                offs = start + tl.arange(0, BLOCK_V)
                                m = offs < V
                                p = tl.load(pc + offs, mask=m, other=0.0)
                                q = tl.load(q_row + offs, mask=m, other=0.0)
                                acc += tl.maximum(p - mass32 * q, 0.0).to(tl.float64)
                            new_mass = tl.sum(acc, axis=0)
                            # Zero residual mass means p_cur == q (rejection has probability 0;
                            # only rounding gets here): keep p_cur, as the reference does.
                            if new_mass > TINY_MASS:
                                for start in range(0, V, BLOCK_V):
                                    offs = start + tl.arange(0, BLOCK_V)
                                    m = offs < V
                                    p = tl.load(pc + offs, mask=m, other=0.0)
                                    q = tl.load(q_row + offs, mask=m, other=0.0)
                                    tl.store(pc + offs, tl.maximum(p - mass32 * q, 0.0), mask=m)
                                mass = new_mass
                        else:
                            # One-hot q: the residual is p_cur with x zeroed.
                            tl.store(pc + x, 0.0)
                            mass = mass - p_x
            if chosen >= 0:
                # Descend: the next level is verified against the target's p after the accepted node.
                cur = chosen
                row = tl.load(packed_ptr + b * N + cur)
                mass = _copy_row_sum(probs_ptr + row * stride_p, pc, V, BLOCK_V)
            else:
                live = b * 0
    # Bonus or recovered token: inverse CDF over p_cur, accumulated in fp64.  p_cur >= 0, so a
    # block's CDF is non-decreasing and its max is its last entry: the carry into the next block.
    carry = mass * 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        p = tl.load(pc + offs, mask=offs < V, other=0.0).to(tl.float64)
        carry = tl.max(carry + tl.cumsum(p, axis=0), axis=0)
    threshold = tl.load(u_ptr + b * N) * carry
    count = b * 0
    carry = mass * 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        p = tl.load(pc + offs, mask=m, other=0.0).to(tl.float64)
        cdf = carry + tl.cumsum(p, axis=0)
        count += tl.sum(((cdf <= threshold) & m).to(tl.int64), axis=0)
        carry = tl.max(cdf, axis=0)
    tl.store(cur_out_ptr + b, cur)
    tl.store(tok_out_ptr + b, tl.minimum(count, V - 1))


def triton_rejection_sample(target_probs: torch.Tensor, trees, uniforms: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Same contract as ``hyspec.ops.rejection.rejection_sample``: (last accepted node, next token)."""
    op = "rejection_sample"
    if target_probs.dim() != 2 or target_probs.dtype != torch.float32:
        raise KernelInputError(f"{op}: target_probs must be a 2-D float32 tensor, got "
                               f"{tuple(target_probs.shape)} {target_probs.dtype}")
    b, n = trees.tokens.shape
    vocab = target_probs.shape[1]
    if uniforms.dim() != 2 or uniforms.shape[0] != b or uniforms.shape[1] < n:
        raise KernelInputError(f"{op}: uniforms must be [B={b}, >= N={n}], got {tuple(uniforms.shape)}")
    q = trees.draft_probs
    if q is not None and (q.shape[:2] != (b, n) or q.shape[2] != vocab):
        raise KernelInputError(f"{op}: draft_probs {tuple(q.shape)} does not match trees [{b}, {n}] and vocab {vocab}")
    tensors = [target_probs, trees.tokens, uniforms] + ([] if q is None else [q])
    check_device(op, _rejection_sample_kernel, *tensors)
    device = target_probs.device
    cur = torch.empty(b, dtype=torch.int64, device=device)
    token = torch.empty(b, dtype=torch.int64, device=device)
    if b == 0:
        return cur, token
    probs = target_probs if target_probs.stride(1) == 1 else target_probs.contiguous()
    children = trees.children.contiguous()
    q_arg = probs if q is None else q.float().contiguous()  # any fp32 pointer when unused
    scratch = torch.empty(b, vocab, dtype=torch.float32, device=device)
    _rejection_sample_kernel[(b,)](
        probs, probs.stride(0),
        trees.packed_index.contiguous(), children, trees.tokens.contiguous(),
        q_arg, uniforms[:, :n].to(torch.float64).contiguous(), scratch, cur, token,
        vocab, n, children.shape[2], trees.max_depth,
        TINY_MASS=TINY, HAS_Q=q is not None, BLOCK_V=min(MAX_BLOCK_V, next_power_of_2(vocab)),
    )
    return cur, token


__all__ = ["triton_rejection_sample"]
