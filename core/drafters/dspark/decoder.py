"""The DSpark decoder: Markov bias, confidence and selection for one block position per call.

DSpark's backbone (DFlash) gives base logits and a hidden state for every
block slot in one forward.  The decoder then walks the slots left to right:

    e_j      = markov_in[x_{j-1}]                       # rank-r embedding of the token chosen before
    logits_j = base_j + markov_out(e_j)                 # low-rank bigram bias
    c_j      = sigmoid(confidence([hidden_j ; e_j]))    # P(slot j accepted | slots < j accepted)
    S_j      = S_{j-1} * c_j                            # P(the prefix up to j survives verification)
    q_j      = process(logits_j)                        # temperature/top-k/top-p/min-p, as the target
    x_j      = inverse-CDF(q_j, u_j)                    # argmax for greedy rows (q_j is one-hot)

:class:`DSparkDecoder` is one step of that walk as pure tensor ops on static
shapes (no data-dependent Python control flow), so it exports to ONNX and can
run in ONNX Runtime on CPU workers; the loop over slots lives outside
(:func:`decode_block`).  ``x_0`` is the root, ``S_0 = 1``.

Where the block is cut: verifying one more draft costs roughly a fixed amount
of target work, worth ``threshold`` tokens; including slot j gains S_j
expected accepted tokens (it counts only if the whole prefix survives).  S_j
never grows with j, so ``sum_{j<=L} (S_j - threshold)`` is maximised by the
longest prefix with ``S_j >= threshold`` -- the cut :meth:`DecodedBlock.cut`
applies (at least one draft).  c_j and S_j depend on x_{<j} only, never on
x_j: whether slot j is verified is decided before x_j is drawn, so x_j given
that it is verified is still distributed as q_j and the chain verifier stays
lossless.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from hyspec.ops.sampling import SamplingTensors

_TINY = 1e-30
INPUT_NAMES = ("base_logits", "hidden", "prev_token", "survival", "temperature", "top_k", "top_p", "min_p", "uniform")
OUTPUT_NAMES = ("q", "token", "confidence", "survival_out")


def process_static(
    logits: torch.Tensor,  # [B, V]
    temperature: torch.Tensor,  # [B] 0 = greedy
    top_k: torch.Tensor,  # [B] int64, <= 0 or >= V = off
    top_p: torch.Tensor,  # [B] 1 = off
    min_p: torch.Tensor,  # [B] 0 = off
) -> torch.Tensor:  # [B, V] fp32
    """``hyspec.ops.sampling.process_logits`` without data-dependent branches (same rules, same ties)."""
    V = logits.shape[-1]
    lowest = torch.finfo(torch.float32).min
    x = torch.nan_to_num(logits.float(), nan=lowest, posinf=lowest, neginf=lowest)
    greedy = temperature == 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).float()
    x = (x - x.max(dim=-1, keepdim=True).values) / temp[:, None]
    neg_inf = torch.full_like(x[:, :1], float("-inf"))
    k_on = (top_k > 0) & (top_k < V)
    if not torch.onnx.is_in_onnx_export() and not bool((k_on | (top_p < 1.0)).any()):
        # Eager, no top-k / top-p: both cut-offs below are -inf, so the vocabulary-wide sort (most of a
        # DSpark draft step on a CPU: 41 ms for a 4-token block of SmolLM2) would change nothing.
        return _apply_min_p(x, greedy, min_p)
    sorted_x = x.sort(dim=-1, descending=True).values
    k = torch.where(k_on, top_k, torch.full_like(top_k, V))
    kth = torch.where(k_on[:, None], sorted_x.gather(1, (k - 1)[:, None]), neg_inf)
    sorted_x = sorted_x.masked_fill(sorted_x < kth, float("-inf"))
    probs = torch.softmax(sorted_x, dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    kept = (mass_before < top_p.float()[:, None]).sum(dim=-1, keepdim=True).clamp(min=1)
    cutoff = torch.where((top_p < 1.0)[:, None], sorted_x.gather(1, kept - 1), neg_inf)
    x = x.masked_fill(x < torch.maximum(kth, cutoff), float("-inf"))
    return _apply_min_p(x, greedy, min_p)


def _apply_min_p(x: torch.Tensor, greedy: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """The min-p floor on max-shifted, temperature-scaled logits ``x``, then the one-hot / softmax rows."""
    no_floor = torch.full_like(min_p.float(), float("-inf"))
    threshold = torch.where(min_p > 0, min_p.float().clamp_min(_TINY).log(), no_floor)
    x = x.masked_fill(x < threshold[:, None], float("-inf"))
    one_hot = (torch.arange(x.shape[-1], device=x.device)[None, :] == x.argmax(dim=-1, keepdim=True)).float()
    return torch.where(greedy[:, None], one_hot, torch.softmax(x, dim=-1))


def inverse_cdf(q: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:  # [B, V], [B] -> [B] int64
    """``hyspec.ops.sampling.sample_from_uniforms`` as comparisons (searchsorted, right side)."""
    cdf = q.double().cumsum(dim=-1)
    target = uniform.double() * cdf[:, -1]
    return (cdf <= target[:, None]).long().sum(dim=-1).clamp(max=q.shape[-1] - 1)


class DSparkDecoder(nn.Module):
    """One left-to-right step of DSpark's selection (see the module docstring)."""

    def __init__(self, vocab_size: int, hidden_size: int, rank: int):
        super().__init__()
        if rank < 1:
            raise ValueError(f"the DSpark Markov head needs rank >= 1, got {rank}")
        self.markov_in = nn.Embedding(vocab_size, rank)
        self.markov_out = nn.Linear(rank, vocab_size, bias=False)
        self.confidence = nn.Linear(hidden_size + rank, 1)
        with torch.no_grad():
            nn.init.normal_(self.markov_in.weight, std=0.02)
            self.markov_out.weight.zero_()  # starts as plain DFlash
            self.confidence.weight.zero_()
            self.confidence.bias.fill_(2.0)  # starts trusting the backbone (c = 0.88)

    def biased_logits(self, base_logits: torch.Tensor, prev_token: torch.Tensor) -> torch.Tensor:  # [..., V] fp32
        return base_logits.float() + self.markov_out(self.markov_in(prev_token)).float()

    def confidence_logit(self, hidden: torch.Tensor, prev_token: torch.Tensor) -> torch.Tensor:  # [...]
        e = self.markov_in(prev_token)
        return self.confidence(torch.cat([hidden.to(e.dtype), e], dim=-1)).squeeze(-1).float()

    def forward(
        self,
        base_logits: torch.Tensor,  # [B, V] fp32 the backbone's logits for this slot
        hidden: torch.Tensor,  # [B, H] the backbone's hidden state for this slot (after its final norm)
        prev_token: torch.Tensor,  # [B] int64 the token chosen for the slot before (the root for slot 1)
        survival: torch.Tensor,  # [B] fp32 S_{j-1}
        temperature: torch.Tensor,  # [B] fp32
        top_k: torch.Tensor,  # [B] int64
        top_p: torch.Tensor,  # [B] fp32
        min_p: torch.Tensor,  # [B] fp32
        uniform: torch.Tensor,  # [B] fp64 in [0, 1), ignored by greedy rows
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # q [B, V], token [B], c_j [B], S_j [B]
        logits = self.biased_logits(base_logits, prev_token)
        confidence = torch.sigmoid(self.confidence_logit(hidden, prev_token))
        q = process_static(logits, temperature, top_k, top_p, min_p)
        return q, inverse_cdf(q, uniform), confidence, survival.float() * confidence


Step = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass
class DecodedBlock:
    tokens: torch.Tensor  # [B, K] int64
    q: torch.Tensor  # [B, K, V] fp32 the distribution each token was drawn from
    confidence: torch.Tensor  # [B, K] c_j
    survival: torch.Tensor  # [B, K] S_j

    def cut(self, threshold: float, limits: list[int]) -> list[int]:
        """Per row: the longest prefix with S_j >= threshold, at least 1 and at most ``limits[row]``."""
        keep = (self.survival >= threshold).long().cumprod(dim=-1).sum(dim=-1).tolist()
        return [max(1, min(n, limit)) for n, limit in zip(keep, limits)]


def decode_block(
    step: Step,  # a DSparkDecoder, or an OnnxDecoder running the exported one
    base_logits: torch.Tensor,  # [B, K, V]
    hidden: torch.Tensor,  # [B, K, H]
    roots: torch.Tensor,  # [B] int64
    sampling: SamplingTensors,  # [B] rows
    uniforms: torch.Tensor,  # [B, K] fp64
) -> DecodedBlock:
    """Walk the K slots left to right, feeding each chosen token to the next step."""
    B, K, _ = base_logits.shape
    prev = roots.long()
    survival = torch.ones(B, dtype=torch.float32, device=base_logits.device)
    out: list[tuple[torch.Tensor, ...]] = []
    for j in range(K):
        q, token, confidence, survival = step(base_logits[:, j].float(), hidden[:, j].float(), prev, survival,
                                              sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p,
                                              uniforms[:, j].double())
        out.append((q, token, confidence, survival))
        prev = token
    q, tokens, confidence, survival = (torch.stack(t, dim=1) for t in zip(*out))
    return DecodedBlock(tokens=tokens, q=q, confidence=confidence, survival=survival)


def export_onnx(decoder: DSparkDecoder, path: str | Path, opset: int = 17) -> Path:
    """Write the decoder step as an ONNX graph (batch size dynamic, everything else static)."""
    path = Path(path)
    V, r = decoder.markov_in.weight.shape
    H = decoder.confidence.in_features - r
    module = _Float32Step(decoder)
    B = 2
    example = (torch.zeros(B, V), torch.zeros(B, H), torch.zeros(B, dtype=torch.int64), torch.ones(B),
               torch.ones(B), torch.zeros(B, dtype=torch.int64), torch.ones(B), torch.zeros(B),
               torch.full((B,), 0.5, dtype=torch.float64))
    batch = {0: "batch"}
    # The TorchScript exporter: the dynamo one needs onnxscript, which hyspec does not depend on.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.onnx.export(module, example, str(path), input_names=list(INPUT_NAMES),
                          output_names=list(OUTPUT_NAMES), opset_version=opset, dynamo=False,
                          dynamic_axes={name: batch for name in INPUT_NAMES + OUTPUT_NAMES})
    return path


class _Float32Step(nn.Module):
    """An fp32 copy of the decoder for export (the served one may be bf16)."""

    def __init__(self, decoder: DSparkDecoder):
        super().__init__()
        V, r = decoder.markov_in.weight.shape
        self.inner = DSparkDecoder(V, decoder.confidence.in_features - r, r)
        self.inner.load_state_dict({k: v.float() for k, v in decoder.state_dict().items()})
        self.inner.eval()

    def forward(self, *args: torch.Tensor):
        return self.inner(*args)


class OnnxDecoder:
    """The exported decoder step in ONNX Runtime, callable like :class:`DSparkDecoder` (torch in, torch out)."""

    def __init__(self, path: str | Path, threads: int | None = None):
        import onnxruntime as ort  # lazy: core never imports it at module import

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def __call__(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = {name: t.detach().cpu().numpy() for name, t in zip(INPUT_NAMES, args)}
        return tuple(torch.from_numpy(a) for a in self.session.run(list(OUTPUT_NAMES), feed))
