"""When a request stops, applied one emitted token at a time.

Plain and speculative decoding emit tokens through the same function, so a
stop token, a stop string or ``max_tokens`` ends both at the same token (a
speculative step can accept several tokens past a stop; they are dropped).
"""
from __future__ import annotations

from hyspec.engine.sequence import Sequence


def append_token(seq: Sequence, token: int, eos_ids: frozenset[int], max_model_len: int) -> bool:
    """Append ``token`` to ``seq``; return True (and set the finish reason) if the request is done."""
    seq.token_ids.append(token)
    params = seq.params
    if not params.ignore_eos and token in eos_ids:
        seq.finish_reason, seq.stop_reason = "stop", None
        return True
    if token in params.stop_token_ids:
        seq.finish_reason, seq.stop_reason = "stop", token
        return True
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        seq.finish_reason = "length"
        return True
    if len(seq.token_ids) >= max_model_len:
        seq.finish_reason = "length"
        return True
    return False


def find_stop_string(seq: Sequence, text: str, new_chars: int) -> tuple[str, int] | None:
    """First stop string that appears in ``text`` overlapping its last ``new_chars`` characters.

    Returns (stop string, index in text) or None.
    """
    best = None
    for stop in seq.params.stop:
        start = max(0, len(text) - new_chars - len(stop) + 1)
        idx = text.find(stop, start)
        if idx != -1 and (best is None or idx < best[1]):
            best = (stop, idx)
    return best
