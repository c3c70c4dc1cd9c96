"""Per-request sampling parameters, shaped like vLLM's ``SamplingParams``."""
from __future__ import annotations

from dataclasses import dataclass, field

from hyspec.errors import RequestError
from hyspec.structured.params import StructuredOutputError, StructuredOutputsParams


@dataclass
class SamplingParams:
    """How one request samples and when it stops.

    ``temperature=0`` is greedy decoding.  ``top_k`` of 0 or -1 and ``top_p``
    of 1 switch those filters off.  A ``seed`` makes the request reproducible
    whatever else shares its batch.

    ``n`` completions are sampled from one prefill of the prompt (the samples
    share its KV pages); ``best_of`` samples that many and returns the ``n``
    with the highest mean token logprob.  Sample ``i`` of a seeded request uses
    ``seed + i`` (vLLM's rule), so the samples differ yet reproduce.  Both need
    ``temperature > 0``: greedy decoding would give ``n`` identical answers
    (vLLM refuses that combination the same way).

    ``logprobs=k`` returns, per generated token, its logprob plus the top
    ``k``; ``prompt_logprobs=k`` the same for every prompt token but the first
    (whose entry is None).  They are the target's (``hyspec.engine.logprobs``).

    Sampling controls, with vLLM's names, ranges and semantics (``hyspec.engine.controls``;
    applied to the target's logits before temperature and the filters, at every position
    speculation verifies, so they stay lossless under every method):
    ``presence_penalty`` and ``frequency_penalty`` in [-2, 2] over the output tokens,
    ``repetition_penalty`` > 0 over prompt and output (1 = off), ``logit_bias`` (token id ->
    bias, clamped to [-100, 100]), ``min_tokens`` (EOS and ``stop_token_ids`` masked until
    that many tokens are out), ``bad_words`` (a word's last token is banned where the output
    ends with the rest of it) and ``allowed_token_ids`` (every other token masked).

    ``structured_outputs`` (vLLM's ``StructuredOutputsParams``: a JSON schema, regex, choice or
    grammar) masks every token the grammar forbids, at the same positions (``hyspec.structured``).
    """

    n: int = 1
    best_of: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    extra: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        # Every value must survive the float32 / int64 tensors the samplers build each step:
        # a value that overflows or rounds to 0 there would fail the whole batch, not one request.
        for name in ("temperature", "top_p", "min_p"):
            _check_float32(name, getattr(self, name))
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k > 2**31 - 1:
            raise RequestError(f"top_k must be an integer below 2**31, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -(2**63) <= self.seed < 2**64):
            raise RequestError(f"seed must be a 64-bit integer, got {self.seed!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool)):
            raise RequestError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or self.temperature != self.temperature or self.temperature < 0:
            raise RequestError(f"temperature must be >= 0, got {self.temperature}")
        _check_count("n", self.n)
        if self.best_of is not None:
            _check_count("best_of", self.best_of)
            if self.best_of < self.n:
                raise RequestError(f"best_of must be at least n ({self.n}), got {self.best_of}")
        if self.temperature == 0 and self.num_samples > 1:
            name = "n" if self.n > 1 else "best_of"
            raise RequestError(f"{name} must be 1 when using greedy sampling (temperature 0), got "
                               f"{getattr(self, name)}: greedy decoding gives identical completions")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise RequestError(f"{name} must be None or an integer >= 0, got {value!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise RequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise RequestError(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k}")
        if self.top_k == -1:
            self.top_k = 0
        if not 0.0 <= self.min_p <= 1.0:
            raise RequestError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int):
            raise RequestError(f"min_tokens must be an integer, got {self.min_tokens!r}")
        if self.min_tokens < 0 or (self.max_tokens is not None and self.min_tokens > self.max_tokens):
            raise RequestError(f"min_tokens must be in [0, max_tokens], got {self.min_tokens}")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        if any(not isinstance(s, str) for s in self.stop):
            raise RequestError("stop must be a string or a list of strings")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise RequestError("stop_token_ids must be non-negative integers")
        if self.seed is not None and not isinstance(self.seed, int):
            raise RequestError(f"seed must be an integer, got {self.seed!r}")
        self._check_controls()
        self._check_structured_outputs()

    def _check_controls(self) -> None:
        """vLLM's ranges for the sampling controls; ids against the vocabulary are the engine's check."""
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check_float32(name, value)
            if not -2.0 <= value <= 2.0:
                raise RequestError(f"{name} must be in [-2, 2], got {value}")
        _check_float32("repetition_penalty", self.repetition_penalty)
        if self.repetition_penalty <= 0.0:
            raise RequestError(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise RequestError("logit_bias must be a mapping of token id to bias")
            bias = {}
            for token, value in self.logit_bias.items():
                try:  # JSON object keys are strings: "50256" is token 50256 (vLLM converts them the same way)
                    token_id = int(token)
                except (TypeError, ValueError):
                    raise RequestError(f"logit_bias key {token!r} is not a token id") from None
                if isinstance(token, bool) or isinstance(token, float) or token_id < 0:
                    raise RequestError(f"logit_bias key {token!r} is not a token id")
                _check_float32(f"logit_bias[{token_id}]", value)
                bias[token_id] = min(100.0, max(-100.0, float(value)))  # vLLM's (and OpenAI's) clamp
            self.logit_bias = bias or None
        if self.allowed_token_ids is not None:
            ids = self.allowed_token_ids
            if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
                raise RequestError("allowed_token_ids must be a list of token ids")
            ids = list(ids)
            if not ids:
                raise RequestError("allowed_token_ids must not be empty (no token could be sampled)")
            if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
                raise RequestError("allowed_token_ids must be non-negative integers")
            self.allowed_token_ids = ids
        if self.bad_words is not None:
            words = [self.bad_words] if isinstance(self.bad_words, str) else self.bad_words
            if not isinstance(words, (list, tuple)) or any(not isinstance(w, str) for w in words):
                raise RequestError("bad_words must be a list of strings")
            if any(not w.strip() for w in words):
                raise RequestError(f"bad_words cannot contain an empty string, got {list(words)!r}")
            self.bad_words = list(dict.fromkeys(words)) or None

    def _check_structured_outputs(self) -> None:
        """vLLM's ``StructuredOutputsParams`` (a dict of its fields is taken too); the grammar itself is compiled
        by the engine, against the model's tokenizer (``hyspec.structured``)."""
        constraint = self.structured_outputs
        if constraint is None:
            return
        if isinstance(constraint, dict):
            try:
                self.structured_outputs = constraint = StructuredOutputsParams(**constraint)
            except TypeError as exc:  # an unknown key
                raise StructuredOutputError("structured_outputs", str(exc).split("__init__() ")[-1]) from None
        if not isinstance(constraint, StructuredOutputsParams):
            raise RequestError("structured_outputs must be a StructuredOutputsParams (or a dict of its fields), "
                               f"got {type(constraint).__name__}")
        if self.ignore_eos:
            raise RequestError("ignore_eos cannot be combined with structured_outputs: the grammar ends the output "
                               "with end-of-sequence, and nothing may follow it")

    @property
    def has_controls(self) -> bool:
        """Whether any sampling control changes the target's logits (then the request gets processors)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.min_tokens or self.bad_words or self.allowed_token_ids is not None)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def num_samples(self) -> int:
        """Completions sampled per prompt (``best_of`` if given, else ``n``)."""
        return self.best_of if self.best_of is not None else self.n

    def for_sample(self, index: int) -> "SamplingParams":
        """The one-completion parameters of sample ``index`` of this request (seed + index).

        When ``best_of`` > ``n`` every sample needs its own logprob to be ranked, so a request
        without ``logprobs`` scores its samples with ``logprobs=0`` (the caller drops them again).
        """
        import dataclasses

        logprobs = self.logprobs
        if logprobs is None and self.num_samples > self.n:
            logprobs = 0
        return dataclasses.replace(self, n=1, best_of=None, logprobs=logprobs,
                                   seed=None if self.seed is None else (self.seed + index) % 2**64,
                                   extra=dict(self.extra))


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(f"{name} must be a positive integer, got {value!r}")


def _check_float32(name: str, value: object) -> None:
    import math

    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number, got {value!r}")
    if abs(value) > 3.0e38:
        raise RequestError(f"{name} is too large ({value!r})")
    if value != 0 and abs(value) < 1.2e-38:
        raise RequestError(f"{name} is too small to represent ({value!r}); use 0 or at least 1e-38")
