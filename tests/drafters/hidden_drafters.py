"""Shared set-up for the MTP / DFlash / DSpark tests: a tiny target, its greedy outputs, quick training.

Drafters trained here learn the tiny target's own greedy continuations of
the test prompts (a few hundred Adam steps with a sharp teacher), so that in
the identity runs most drafts are accepted: long accepted chains, bonus
tokens and the roll-back of draft caches all happen.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from hyspec import LLM, SamplingParams
from tests.model.tiny_checkpoint import make_checkpoint

PROMPTS = ["def add(a, b):", "import os\n", "class Foo:\n    def", "x = [", "return self",
           "for i in range(", "if x is None:\n    ", "@property\ndef name(self):"]
MAX_TOKENS = 40
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
# The goodput controller reacts to measured step times (noise on a shared box): off, so tests are about tokens.
FAST = {"controller": {"enabled": False, "profile_at_startup": False}}




@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hidden_drafter_target")
    make_checkpoint(path, "llama_gqa", layers=2, seed=0)
    return path


@pytest.fixture(scope="module")
def plain(target_dir) -> dict[str, Any]:
    """Plain greedy decoding of PROMPTS: the reference outputs and the full token sequences."""
    llm = LLM(str(target_dir), dtype="float32", kv_cache_bytes=8 << 20)
    outs = llm.generate(PROMPTS, GREEDY)
    return {"outputs": [o.outputs[0].token_ids for o in outs],
            "sequences": [o.prompt_token_ids + o.outputs[0].token_ids for o in outs]}


def spec_llm(target_dir: Path, config: dict[str, Any], **kw) -> LLM:
    return LLM(str(target_dir), dtype="float32", kv_cache_bytes=kw.pop("kv_cache_bytes", 8 << 20),
               speculative_config={**FAST, **config}, **kw)


def generate_in_batches(llm: LLM, batch: int, count: int = len(PROMPTS),
                        params: SamplingParams = GREEDY) -> list[list[int]]:
    """Greedy outputs of the first ``count`` prompts, ``batch`` requests at a time."""
    out = []
    for i in range(0, count, batch):
        out += [o.outputs[0].token_ids for o in llm.generate(PROMPTS[i:min(i + batch, count)], params)]
    return out


def assert_clean_pool(llm: LLM) -> None:
    """Every page is back in the free list: target and drafters released everything."""
    pool = llm.engine.pool
    pool.assert_all_free()


def totals(llm: LLM) -> dict[str, Any]:
    return llm.engine.spec.metrics.snapshot()["totals"]


def target_batch(target, sequences: list[list[int]], aux_layers: tuple[int, ...]):
    """The frozen target's view of the sequences, right-padded (padding never counts, nor the last token)."""
    from hyspec.train.base import TargetBatch

    length = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), length, dtype=torch.int64)
    mask = torch.zeros(len(sequences), length, dtype=torch.bool)
    for row, s in enumerate(sequences):
        ids[row, :len(s)] = torch.tensor(s)
        mask[row, :len(s) - 1] = True  # position p counts when token p+1 is real
    with torch.no_grad():
        out = target.forward_dense(ids, aux_layers=aux_layers)
    return TargetBatch(ids, mask, out.hidden, out.aux_hidden)


def train_drafter(method: str, target_dir: Path, out_dir: Path, sequences: list[list[int]], steps: int,
                  options: dict[str, Any] | None = None, lr: float = 5e-3, seed: int = 0) -> dict[str, float]:
    """Train ``method``'s recipe on ``sequences`` for ``steps`` full-batch Adam steps, save it to ``out_dir``."""
    from hyspec.model.loader import load_model
    from hyspec.train.registry import resolve_recipe

    torch.manual_seed(seed)
    recipe = resolve_recipe(method)
    target = load_model(target_dir, dtype="float32")
    drafter = recipe.build(target, {"teacher_temperature": 0.02, **(options or {})})
    batch = target_batch(target, sequences, tuple(recipe.aux_layers(target.config)))
    optimizer = torch.optim.Adam(recipe.trainable_parameters(drafter), lr=lr)
    metrics: dict[str, float] = {}
    for _ in range(steps):
        loss, metrics = recipe.loss(drafter, target, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    recipe.save(drafter.eval(), target_dir, out_dir)
    return metrics


def reclaim_before(llm: LLM, method: str, calls: tuple[int, ...], idle_every: int = 0) -> dict[str, int]:
    """Make the pool take every draft cache back before the listed ``propose`` calls (the drafter restarts).

    With ``idle_every``, every such call drafts nothing without asking the drafter, as when the
    dispatcher picks another method: the drafter must catch up on the steps it missed.
    """
    proposer = llm.engine.spec.proposers[method]
    inner = proposer.propose
    seen = {"n": 0, "reclaimed": 0, "max_offset": 0}

    def propose(requests, sampling):
        seen["n"] += 1
        if seen["n"] in calls:
            seen["reclaimed"] += proposer.states.reclaim(10 ** 9) > 0
        seen["max_offset"] = max([seen["max_offset"]] + [st.offset for st in proposer.states.values()])
        if idle_every and seen["n"] % idle_every == 0:
            return [None] * len(requests)
        return inner(requests, sampling)

    proposer.propose = propose
    return seen


# -- temperature > 0: vectorised speculative decoding of a toy target with block drafters --------

def decode_chains(models, draft, sampling, seed: int, num_seqs: int, length: int, block: int) -> torch.Tensor:
    """Decode ``num_seqs`` sequences of a toy Markov target speculatively until each has ``length`` tokens.

    ``draft(pos [m], root [m], sampling [m], uniforms [m, block]) -> (tokens [m, block], q [m, block, V],
    lengths [m])`` proposes one chain per sequence (only the first ``lengths[r]`` drafts are verified);
    ``models`` is a ``tests.test_verify_stats.ToyModels``.  Returns the first ``length`` emitted tokens.
    """
    from hyspec.seam.tree import TreeBatch
    from hyspec.spec.verify import verify
    from tests.test_verify_stats import BOS

    g = torch.Generator().manual_seed(seed)
    V = models.target_logits.shape[-1]
    out = torch.full((num_seqs, length + block + 1), -1, dtype=torch.int64)
    count = torch.zeros(num_seqs, dtype=torch.int64)
    last = torch.full((num_seqs,), BOS, dtype=torch.int64)
    parents = torch.arange(-1, block)
    while bool((count < length).any()):
        active = (count < length).nonzero().squeeze(1)
        m, pos, root = active.numel(), count[active], last[active]
        rows = sampling.select(active)
        tokens, q, lengths = draft(pos, root, rows, torch.rand(m, block, generator=g, dtype=torch.float64))
        nodes = torch.cat([root[:, None], tokens], dim=1)  # [m, block + 1]
        q_rows = torch.cat([q.new_zeros(m, 1, V), q], dim=1)
        batch = TreeBatch(nodes, parents.expand(m, -1), lengths + 1, q_rows, V)
        node_logits = models.target_logits[pos[:, None] + torch.arange(block + 1), nodes]  # [m, block + 1, V]
        result = verify(node_logits[:, :batch.max_nodes][batch.valid], batch, rows,
                        uniforms=torch.rand(m, batch.max_nodes, generator=g, dtype=torch.float64))
        emitted = torch.cat([result.accepted_tokens, torch.full((m, 1), -1)], dim=1)
        emitted[torch.arange(m), result.num_accepted] = result.next_token
        cols = count[active, None] + torch.arange(emitted.shape[1])[None, :]
        out[active[:, None].expand_as(cols), cols] = torch.where(emitted >= 0, emitted, out[active[:, None], cols])
        count[active] += result.num_accepted + 1
        last[active] = result.next_token
    return out[:, :length]
