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

Races.  A program's threads do not run in lock step: its warps progress
independently, and a value one thread stores to global memory is visible to
another only after a barrier.  The kernel used to keep the one-hot residual in
scratch (one thread zeroing ``p_cur[x]``, every warp reading it in the final
CDF pass) and read scalars of the scratch row right after vector stores to it,
with no ``bar.sync`` between them: warps could take different branches and then
wait at different reductions' barriers (wrong tokens or a hang).  The
interpreter runs threads one after another and can never show it.  Now one-hot
drafts write nothing (the rejected siblings' tokens are masked on load, as vLLM
did for its recovered-token kernel), and stored drafts fence every write of the
scratch row with ``tl.debug_barrier()``; ``tests/test_cuda_ops_aot.py`` checks
the compiled PTX for both.

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
#: ``p - mass * q`` must round twice, as the reference's two torch ops do: no FMA contraction (Triton 3.9
#: contracts by default and warns that 3.10 will not; set here so the numerics do not depend on the version).
LAUNCH_OPTIONS = {"enable_fp_fusion": False}


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
def _seen_before(children_ptr, tokens_ptr, node_base, child_base, x, rank):
    """Whether token ``x`` is the token of a sibling of rank < ``rank`` (those were all rejected)."""
    seen = x * 0
    for r in range(0, rank):
        other = tl.load(children_ptr + node_base + r)
        if other >= 0:
            seen = seen | (tl.load(tokens_ptr + child_base + other) == x).to(tl.int64)
    return seen


@triton.jit(do_not_specialize=["N", "C", "max_depth"])  # per tree shape: one binary
def _rejection_sample_kernel(
    probs_ptr, stride_p,  # [T, V] fp32 target p after every node (packed)
    packed_ptr, children_ptr, tokens_ptr,  # [B, N], [B, N, C], [B, N] int64
    q_ptr,  # [B, N, V] fp32 draft q of every node (unused without HAS_Q)
    u_ptr,  # [B, N] fp64 uniforms
    scratch_ptr,  # [B, V] fp32 residual p_cur (unused without HAS_Q)
    cur_out_ptr, tok_out_ptr,  # [B] int64
    V, N, C, max_depth,
    TINY_MASS: tl.constexpr, HAS_Q: tl.constexpr, BLOCK_V: tl.constexpr,
):
    """One program per sequence.  Memory hazards inside a program (module doc, "Races") are fenced:

    * one-hot drafts (no HAS_Q) never write memory but the two outputs: the residual is the target row
      with the rejected siblings' tokens masked on load;
    * stored drafts (HAS_Q) keep the residual in the program's scratch row, and every write of it is
      bracketed by ``tl.debug_barrier()`` (PTX ``bar.sync``), so no warp reads a value another warp is
      about to overwrite or has not yet written.
    """
    b = tl.program_id(0).to(tl.int64)
    pc = scratch_ptr + b * V
    row = tl.load(packed_ptr + b * N)
    if HAS_Q:
        mass = _copy_row_sum(probs_ptr + row * stride_p, pc, V, BLOCK_V)
        tl.debug_barrier()  # the row copy is complete before any warp reads p_cur(x)
    else:
        mass = _row_sum(probs_ptr + row * stride_p, V, BLOCK_V)
    cur = b * 0  # int64 scalars (a Python int would be a constexpr and could not be reassigned)
    live = b * 0 + 1
    for _depth in range(0, max_depth):
        chosen = b * 0 - 1
        if live != 0:
            node_base = (b * N + cur) * C
            for rank in range(0, C):
                child = tl.load(children_ptr + node_base + rank)
                if (chosen < 0) & (child >= 0):
                    x = tl.load(tokens_ptr + b * N + child)
                    u = tl.load(u_ptr + b * N + child)
                    if HAS_Q:
                        p_x = tl.load(pc + x).to(tl.float64)
                        q_row = q_ptr + (b * N + child) * V
                        q_x = tl.load(q_row + x).to(tl.float64)
                    else:
                        # p_cur is the row with every earlier (rejected) sibling's token zeroed
                        p_x = tl.load(probs_ptr + row * stride_p + x).to(tl.float64)
                        if _seen_before(children_ptr, tokens_ptr, node_base, b * N, x, rank) != 0:
                            p_x = p_x * 0.0
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
                                tl.debug_barrier()  # every warp has read p_cur(x) before it changes
                                for start in range(0, V, BLOCK_V):
                                    offs = start + tl.arange(0, BLOCK_V)
                                    m = offs < V
                                    p = tl.load(pc + offs, mask=m, other=0.0)
                                    q = tl.load(q_row + offs, mask=m, other=0.0)
                                    tl.store(pc + offs, tl.maximum(p - mass32 * q, 0.0), mask=m)
                                tl.debug_barrier()  # the residual is complete before the next read
                                mass = new_mass
                        else:
                            mass = mass - p_x
            if chosen >= 0:
                # Descend: the next level is verified against the target's p after the accepted node.
                cur = chosen
                row = tl.load(packed_ptr + b * N + cur)
                if HAS_Q:
                    tl.debug_barrier()  # every warp is done with this level's residual
                    mass = _copy_row_sum(probs_ptr + row * stride_p, pc, V, BLOCK_V)
                    tl.debug_barrier()
                else:
                    mass = _row_sum(probs_ptr + row * stride_p, V, BLOCK_V)
            else:
                live = b * 0
    # Bonus or recovered token: inverse CDF over p_cur, accumulated in fp64.  p_cur >= 0, so a
    # block's CDF is non-decreasing and its max is its last entry: the carry into the next block.
    # One-hot drafts: p_cur is the row of ``cur`` with its children's tokens zeroed when every child was
    # rejected (live == 0); when the walk ended on an accepted leaf it is the row itself.
    src = pc if HAS_Q else probs_ptr + row * stride_p
    node_base = (b * N + cur) * C
    carry = mass * 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        p = _masked_residual(src, offs, V, children_ptr, tokens_ptr, node_base, b * N, C, live, HAS_Q)
        carry = tl.max(carry + tl.cumsum(p, axis=0), axis=0)
    threshold = tl.load(u_ptr + b * N) * carry
    count = b * 0
    carry = mass * 0.0
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        m = offs < V
        p = _masked_residual(src, offs, V, children_ptr, tokens_ptr, node_base, b * N, C, live, HAS_Q)
        cdf = carry + tl.cumsum(p, axis=0)
        count += tl.sum(((cdf <= threshold) & m).to(tl.int64), axis=0)
        carry = tl.max(cdf, axis=0)
    tl.store(cur_out_ptr + b, cur)
    tl.store(tok_out_ptr + b, tl.minimum(count, V - 1))


@triton.jit
def _row_sum(src, V, BLOCK_V: tl.constexpr):
    """sum(src[:V]) in fp64."""
    acc = tl.zeros([BLOCK_V], dtype=tl.float64)
    for start in range(0, V, BLOCK_V):
        offs = start + tl.arange(0, BLOCK_V)
        acc += tl.load(src + offs, mask=offs < V, other=0.0).to(tl.float64)
    return tl.sum(acc, axis=0)


@triton.jit
def _masked_residual(src, offs, V, children_ptr, tokens_ptr, node_base, child_base, C, live,
                     HAS_Q: tl.constexpr):
    """p_cur[offs] in fp64: the scratch row (HAS_Q), else the target row minus the rejected children's tokens."""
    p = tl.load(src + offs, mask=offs < V, other=0.0).to(tl.float64)
    if not HAS_Q:
        if live == 0:
            for r in range(0, C):
                child = tl.load(children_ptr + node_base + r)
                if child >= 0:
                    x = tl.load(tokens_ptr + child_base + child)
                    p = tl.where(offs == x, 0.0, p)
    return p


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
    # one-hot drafts keep no residual in memory (the kernel doc); any fp32 pointer stands in
    scratch = probs if q is None else torch.empty(b, vocab, dtype=torch.float32, device=device)
    _rejection_sample_kernel[(b,)](
        probs, probs.stride(0),
        trees.packed_index.contiguous(), children, trees.tokens.contiguous(),
        q_arg, uniforms[:, :n].to(torch.float64).contiguous(), scratch, cur, token,
        vocab, n, children.shape[2], trees.max_depth,
        TINY_MASS=TINY, HAS_Q=q is not None, BLOCK_V=min(MAX_BLOCK_V, next_power_of_2(vocab)),
        **LAUNCH_OPTIONS,
    )
    return cur, token


__all__ = ["triton_rejection_sample"]
