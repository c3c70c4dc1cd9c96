"""The peers: Hugging Face transformers ``generate`` on the same weights, plain and assisted.

* ``hf_generate``: plain ``generate`` (greedy, or sampling at temperature > 0).
* ``hf_prompt_lookup``: assisted generation with prompt lookup
  (``prompt_lookup_num_tokens`` = hyspec's ``num_speculative_tokens``,
  ``max_matching_ngram_size=3``: the same 1..3-token n-grams hyspec's ngram uses).
* ``hf_assisted``: assisted generation with hyspec's draft_model drafter (a
  plain HF Llama checkpoint) as ``assistant_model``, drafting
  ``num_speculative_tokens`` tokens per step on a constant schedule.

Same prompts (token ids, left-padded in a batch), same dtype and device, the
same number of generated tokens: the models' ``eos_token_id`` is cleared, so
neither side stops or suppresses at EOS.  Sampling uses ``top_k=0, top_p=1``
(transformers otherwise defaults to top-k 50) and a seed per wave.
transformers supports assisted generation at batch size 1 only; other batch
sizes are reported as unsupported.
"""
from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import torch

from hyspec.bench.machine import PeakMemory, synchronize
from hyspec.bench.measure import WARMUP_TOKENS, Measurement, Workload, timed_passes
from hyspec.bench.stats import Spread
from hyspec.bench.vs_transformers import load_transformers

ASSISTED = ("hf_prompt_lookup", "hf_assisted")
PROMPT_LOOKUP_NGRAM = 3


class PeerUnavailable(Exception):
    """A peer cannot run this configuration; the message is the reason shown in its column."""


def transformers_missing() -> str | None:
    """None when transformers imports, else the reason it does not."""
    try:
        import transformers  # noqa: F401
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        return f"transformers is not installed ({type(exc).__name__}: {exc})"
    return None


class _FirstTokenClock:
    """A streamer that notes when the first generated tokens arrive (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_time: float | None = None

    def put(self, value: torch.Tensor) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_time is None:
            self.first_token_time = time.perf_counter()

    def end(self) -> None:
        pass


class HFModels:
    """The target (and, when there is one, the draft_model drafter) loaded by transformers."""

    def __init__(self, target: Path, dtype: torch.dtype, device: torch.device, assistant: Path | None,
                 num_speculative_tokens: int):
        import transformers  # noqa: F401  (an ImportError here: the peer rows say it is not installed)

        self.device = device
        self.num_speculative_tokens = num_speculative_tokens
        self.target = self._load(target, dtype, "the target")
        self.pad_id = self.target.generation_config.pad_token_id
        if self.pad_id is None:
            self.pad_id = self.target.config.pad_token_id if self.target.config.pad_token_id is not None else 0
        self.assistant = None
        self.assistant_error: str | None = "no draft_model drafter to use as the assistant"
        if assistant is not None:
            try:
                self.assistant = self._load(assistant, dtype, "the draft_model drafter")
                self.assistant_error = None
                # transformers reads the draft length from the assistant's own generation config
                self.assistant.generation_config.num_assistant_tokens = num_speculative_tokens
                self.assistant.generation_config.num_assistant_tokens_schedule = "constant"
            except PeerUnavailable as exc:
                self.assistant_error = str(exc)

    def _load(self, path: Path, dtype: torch.dtype, what: str) -> Any:
        try:
            model = load_transformers(path, dtype, self.device)
        except Exception as exc:  # a checkpoint transformers cannot read: the column says why
            raise PeerUnavailable(f"transformers cannot load {what} ({path}): {type(exc).__name__}: {exc}") from None
        # Generate exactly max_new_tokens on both sides: no stop (and no suppression) at EOS.
        model.generation_config.eos_token_id = None
        return model

    def close(self) -> None:
        self.target = self.assistant = None
        gc.collect()

    def unsupported(self, peer: str, workload: Workload) -> str | None:
        if peer in ASSISTED and workload.batch_size > 1:
            return "transformers assisted generation supports batch size 1 only"
        if peer == "hf_assisted" and self.assistant is None:
            return self.assistant_error
        return None

    def _kwargs(self, peer: str, workload: Workload, max_tokens: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"max_new_tokens": max_tokens, "pad_token_id": self.pad_id,
                              "do_sample": workload.temperature > 0}
        if workload.temperature > 0:
            kw.update(temperature=workload.temperature, top_k=0, top_p=1.0)
        if peer == "hf_prompt_lookup":
            kw.update(prompt_lookup_num_tokens=self.num_speculative_tokens,
                      max_matching_ngram_size=PROMPT_LOOKUP_NGRAM)
        elif peer == "hf_assisted":
            kw["assistant_model"] = self.assistant
        return kw

    def _generate_wave(self, peer: str, workload: Workload, wave: range, max_tokens: int,
                       clock: _FirstTokenClock | None) -> list[list[int]]:
        rows = [workload.prompts[i] for i in wave]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, prompt in enumerate(rows):  # left padding: every row's continuation starts at `width`
            ids[row, width - len(prompt):] = torch.tensor(prompt)
            mask[row, width - len(prompt):] = 1
        if workload.temperature > 0:
            torch.manual_seed(workload.seed + wave.start)
        out = self.target.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                   streamer=clock, **self._kwargs(peer, workload, max_tokens))
        synchronize(self.device)
        return out[:, width:].tolist()

    def run(self, peer: str, workload: Workload, repeats: int, peak: PeakMemory) -> Measurement:
        reason = self.unsupported(peer, workload)
        if reason is not None:
            raise PeerUnavailable(reason)
        with torch.inference_mode():
            self._generate_wave(peer, workload, workload.waves[0], min(WARMUP_TOKENS, workload.max_tokens), None)
            peak.reset()

            def run_wave(wave: range) -> tuple[list[list[int]], list[float]]:
                clock = _FirstTokenClock()
                wave_start = time.perf_counter()
                tokens = self._generate_wave(peer, workload, wave, workload.max_tokens, clock)
                first = clock.first_token_time
                return tokens, [] if first is None else [first - wave_start] * len(wave)

            rates, ttfts, outputs, generated = timed_passes(workload, repeats, run_wave)
        return Measurement(tokens_per_s=Spread.of(rates), generated_tokens=generated,
                           ttft_s=Spread.of(ttfts) if ttfts else None, outputs=outputs, peak=peak.read())
