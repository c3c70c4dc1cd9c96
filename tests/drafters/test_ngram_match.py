"""ngram's match length (the hybrid's match_length signal when suffix is not loaded) and its draft agree."""
from __future__ import annotations

import numpy as np

from hyspec.drafters.ngram.proposer import NgramProposer, find_continuation, match_length


def test_the_longest_n_gram_that_occurs_earlier_with_a_token_after_it():
    tokens = np.array([1, 2, 3, 4, 9, 2, 3, 4], dtype=np.int64)
    assert match_length(tokens, 1, 5) == 3  # "2 3 4" occurs before, followed by 9
    assert match_length(tokens, 1, 2) == 2  # capped by n_max
    assert match_length(tokens, 4, 5) == 0  # nothing of 4 or more
    assert match_length(np.array([7], dtype=np.int64), 1, 5) == 0
    # whenever it finds a match, the draft comes from one of that length
    assert find_continuation(tokens, 1, 5, 2) == [9, 2]


class _Seq:
    def __init__(self, tokens):
        self.request_id, self.token_ids = "r", tokens


def test_the_proposer_caps_it_at_the_signals_cap():
    prop = NgramProposer(prompt_lookup_min=1, prompt_lookup_max=8, max_tokens=4, vocab_size=100)
    seq = _Seq([1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6])
    assert prop.match_length(seq, cap=16) == 6
    assert prop.match_length(seq, cap=3) == 3
