"""A test proposer that builds random trees around the known greedy continuation.

It knows the plain-decoding output, hides the right token among random decoys
at a random sibling position (sometimes leaves it out), and grows random
branches, so verification, acceptance along non-first siblings and KV
compaction (node index != depth) are all exercised with deep acceptances.
"""
from __future__ import annotations

import random

from hyspec.seam.proposer import DraftRequest, Proposer
from hyspec.seam.tree import DraftTree


class OracleTreeProposer(Proposer):
    method = "ngram"  # stands in for a loaded method's slot
    builds_trees = True

    def __init__(self, references: dict[tuple[int, ...], list[int]], vocab: int, seed: int = 0, miss_rate: float = 0.2):
        self.references = references  # prompt ids -> greedy continuation
        self.vocab = vocab
        self.rng = random.Random(seed)
        self.miss_rate = miss_rate

    def max_budget(self) -> int:
        return 12

    def propose(self, requests: list[DraftRequest], sampling) -> list[DraftTree | None]:
        out = []
        for req in requests:
            seq = req.seq
            truth = self.references[tuple(seq.prompt_token_ids)][seq.num_output_tokens:]
            tokens, parents = [seq.last_token], [-1]
            frontier = [(0, 0)]  # (node, depth in truth) on the right path
            while len(tokens) - 1 < req.budget and frontier:
                node, depth = frontier.pop(0)
                width = self.rng.randint(1, 3)
                right_at = self.rng.randrange(width) if (depth < len(truth) and self.rng.random() > self.miss_rate) else -1
                for c in range(width):
                    if len(tokens) - 1 >= req.budget:
                        break
                    tok = truth[depth] if c == right_at else self.rng.randrange(3, self.vocab)
                    tokens.append(tok)
                    parents.append(node)
                    if c == right_at:
                        frontier.insert(0, (len(tokens) - 1, depth + 1))
            out.append(DraftTree.from_parents(tokens, parents, vocab_size=self.vocab) if len(tokens) > 1 else None)
        return out
