"""OpenAI request and response bodies as pydantic models (the server's OpenAPI schema comes from these).

Fields follow OpenAI's /v1/completions and /v1/chat/completions, plus the
vLLM extensions clients of vLLM already send (``top_k``, ``min_p``,
``ignore_eos``, ``stop_token_ids``, ...).  Scalars are strict (``"5"`` is not
an integer, ``1`` is not a boolean) and floats must be finite, so a wrong type
is a 400 naming the field, not a silent coercion.  No field is ever ignored:
every field of OpenAI's and vLLM's request schemas is declared here
(implemented) or refused by hyspec.server.request_fields with a 400 naming it
and why, and a key in neither is a 400 naming it too.
``logprobs`` / ``top_logprobs``, ``echo``, ``n`` and ``best_of`` are answered
as OpenAI and vLLM define them (docs/api.md).
"""
from __future__ import annotations

import struct
import time
from typing import Annotated, Any, ClassVar, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr,
                      field_validator, model_validator)

from hyspec.engine.sampling_params import SamplingParams
from hyspec.server import request_fields
from hyspec.server.structured_fields import StructuredOutputFields

# torch.Generator.manual_seed accepts exactly this range.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
# The sampler keeps temperature/top_p in float32 and top_k/token ids in int64: larger values would
# overflow (or top_p underflow to 0) inside an engine step, failing every request in the batch.
FLOAT32_MAX = 3.4028234663852886e38
INT64_MAX = 2**63 - 1
MAX_STOP_STRINGS = 16

Float = StrictFloat  # strict still takes JSON 1 as 1.0; "1" and true are rejected


def _valid_unicode(text: str) -> str:
    # JSON may carry unpaired UTF-16 surrogates ("\ud800"); the tokenizer and UTF-8 output cannot.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains an unpaired UTF-16 surrogate at character {exc.start}; "
                         "send valid Unicode") from None
    return text


Text = Annotated[StrictStr, AfterValidator(_valid_unicode)]
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class _Strict(BaseModel):
    """Finite floats only; an unknown key is an error (nothing a client sends is silently dropped)."""

    model_config = ConfigDict(allow_inf_nan=False, extra="forbid")


class StreamOptions(_Strict):
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = Field(False, description="vLLM extension: usage on every chunk")


class _SamplingRequest(_Strict, StructuredOutputFields):
    """What both endpoints share: model, sampling, stopping, streaming."""

    model: Optional[Text] = Field(None, description="the served model name (optional: it has only one)")
    n: StrictInt = Field(1, ge=1, description="choices per prompt (sampled from one prefill; temperature > 0)")
    temperature: Optional[Float] = Field(None, ge=0, le=FLOAT32_MAX, description="0 is greedy; default 1")
    top_p: Optional[Float] = Field(None, gt=0, le=1)
    top_k: Optional[StrictInt] = Field(None, ge=-1, le=INT64_MAX, description="vLLM extension; 0 or -1: off")
    min_p: Optional[Float] = Field(None, ge=0, le=1, description="vLLM extension")
    seed: Optional[StrictInt] = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: Optional[Union[Text, Annotated[list[Text], Field(max_length=MAX_STOP_STRINGS)]]] = None
    stop_token_ids: Optional[Annotated[list[Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]],
                                       Field(max_length=MAX_STOP_STRINGS)]] = None
    ignore_eos: StrictBool = Field(False, description="vLLM extension: keep going past end-of-sequence")
    include_stop_str_in_output: StrictBool = False
    skip_special_tokens: StrictBool = True
    min_tokens: StrictInt = Field(0, ge=0, description="vLLM extension: no stop before this many tokens")
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    return_token_ids: StrictBool = Field(False, description="vLLM extension: token ids with each choice/delta")
    return_tokens_as_token_ids: StrictBool = Field(
        False, description="vLLM extension: logprob tokens as 'token_id:N' (token texts can collide)")
    prompt_logprobs: Optional[StrictInt] = Field(
        None, ge=0, description="vLLM extension: each prompt token's logprob and the k most likely at each "
                                "(k <= --max-logprobs; not with stream)")
    # sampling controls: vLLM's ranges and semantics, lossless under speculation (docs/sampling_controls.md)
    presence_penalty: Optional[Float] = Field(None, ge=-2, le=2,
                                              description="-2 to 2: penalise tokens already generated")
    frequency_penalty: Optional[Float] = Field(None, ge=-2, le=2,
                                               description="-2 to 2: penalise tokens by their count so far")
    repetition_penalty: Optional[Float] = Field(None, gt=0, description="vLLM extension: > 0, 1 is off")
    logit_bias: Optional[dict[str, Float]] = Field(
        None, description="token id -> bias added to its logit (clamped to [-100, 100]); unknown ids are a 400")
    bad_words: Optional[list[Text]] = Field(None, description="vLLM extension: words never generated")
    allowed_token_ids: Optional[Annotated[list[Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]],
                                          Field(min_length=1)]] = Field(
        None, description="vLLM extension: only these token ids may be generated")

    #: which request_fields table applies ("completions" or "chat")
    ENDPOINT: ClassVar[str] = request_fields.COMPLETIONS

    @model_validator(mode="before")
    @classmethod
    def _no_field_ignored(cls, body: Any) -> Any:
        """Refused fields (request_fields) and unknown keys are 400s naming them, never dropped."""
        if not isinstance(body, dict):
            return body
        try:
            return request_fields.check_fields(cls.ENDPOINT, body, set(cls.model_fields))
        except request_fields.FieldProblem as problem:
            raise FieldError(problem.field, str(problem)) from None

    @field_validator("top_p")
    @classmethod
    def _top_p_survives_float32(cls, value: float | None) -> float | None:
        if value is not None and struct.unpack("f", struct.pack("f", value))[0] == 0.0:
            raise ValueError(f"{value} is 0 in float32, which the sampler uses; top_p must be > 0")
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> "_SamplingRequest":
        if self.stream_options is not None and not self.stream:
            raise FieldError("stream_options", "only allowed when stream is true")
        if self.prompt_logprobs is not None and self.stream:
            raise FieldError("prompt_logprobs", "not available with stream: true (as in vLLM)")
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        """(logprobs, prompt_logprobs) for SamplingParams: top-k per generated / prompt token, or None."""
        return None, None

    @property
    def best_of_value(self) -> int | None:
        return None

    def sampling_params(self, max_tokens: int | None) -> SamplingParams:
        """hyspec SamplingParams for this request (raises RequestError for invalid combinations)."""
        logprobs, prompt_logprobs = self.logprob_counts()
        return SamplingParams(
            n=self.n,
            best_of=self.best_of_value,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            temperature=1.0 if self.temperature is None else float(self.temperature),
            top_p=1.0 if self.top_p is None else float(self.top_p),
            top_k=0 if self.top_k is None else self.top_k,
            min_p=0.0 if self.min_p is None else float(self.min_p),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            presence_penalty=0.0 if self.presence_penalty is None else float(self.presence_penalty),
            frequency_penalty=0.0 if self.frequency_penalty is None else float(self.frequency_penalty),
            repetition_penalty=1.0 if self.repetition_penalty is None else float(self.repetition_penalty),
            logit_bias=self.logit_bias or None,
            bad_words=self.bad_words or None,
            allowed_token_ids=self.allowed_token_ids,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            structured_outputs=self.structured_outputs_params,
        )

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)


class CompletionRequest(_SamplingRequest):
    prompt: Union[Text, Annotated[list[Text], Field(min_length=1)], TokenIds,
                  Annotated[list[TokenIds], Field(min_length=1)]] = Field(
        description="a string, a list of strings, a list of token ids, or a list of token-id lists")
    max_tokens: Optional[StrictInt] = Field(16, ge=1, description="tokens to generate (default 16)")
    echo: StrictBool = Field(False, description="return the prompt before the completion (with its logprobs)")
    logprobs: Optional[StrictInt] = Field(None, ge=0, description="logprobs of each token and of the top k "
                                                                  "(at most the server's --max-logprobs)")
    best_of: Optional[StrictInt] = Field(None, ge=1, description="sample this many, return the n with the "
                                                                 "highest mean token logprob (not streamed)")
    add_special_tokens: StrictBool = Field(True, description="vLLM extension: encode text prompts with the "
                                                             "tokenizer's special tokens (its BOS)")

    ENDPOINT: ClassVar[str] = request_fields.COMPLETIONS

    @model_validator(mode="after")
    def _check_best_of(self) -> "CompletionRequest":
        if self.best_of is not None and self.best_of < self.n:
            raise FieldError("best_of", f"must be at least n ({self.n}), got {self.best_of}")
        if self.stream and self.best_of is not None and self.best_of > self.n:
            raise FieldError("best_of", "best_of > n cannot be streamed (the best are known only at the end)")
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        # vLLM's rule: prompt_logprobs when given, else echo's prompt gets logprobs' k
        return self.logprobs, (self.prompt_logprobs if self.prompt_logprobs is not None
                               else self.logprobs if self.echo else None)

    @property
    def best_of_value(self) -> int | None:
        return self.best_of


class TextPart(_Strict):
    type: Literal["text"]
    text: Text


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[Text, list[TextPart]]] = None
    name: Optional[Text] = None
    # an assistant turn's reasoning, for templates that keep it in the history (Qwen3's reads reasoning_content;
    # vLLM's name is reasoning: the template sees it under both, as transformers passes it)
    reasoning: Optional[Text] = None
    reasoning_content: Optional[Text] = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def chars(self) -> int:
        """Characters of the client's text in this message (bounded by --max-prompt-chars)."""
        return sum(len(t or "") for t in (self.text(), self.name, self.reasoning, self.reasoning_content))


class ChatCompletionRequest(_SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Optional[StrictInt] = Field(None, ge=1, description="deprecated by OpenAI: max_completion_tokens")
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1, description="default: up to max_model_len")
    add_generation_prompt: StrictBool = Field(True, description="vLLM extension: end the prompt with the "
                                                                "template's assistant header")
    continue_final_message: StrictBool = Field(False, description="vLLM extension: leave the final message open "
                                                                  "for the model to continue (with "
                                                                  "add_generation_prompt: false)")
    chat_template_kwargs: Optional[dict[str, Any]] = Field(
        None, description="vLLM extension: more chat-template variables (Qwen3's enable_thinking); names the "
                          "template does not read are passed on unused")
    documents: Optional[list[dict[str, Text]]] = Field(
        None, description="vLLM extension: documents for templates that take them (retrieval-augmented "
                          "generation), e.g. [{'title': ..., 'text': ...}]")
    logprobs: Optional[StrictBool] = Field(None, description="return the logprob of each output token")
    top_logprobs: Optional[StrictInt] = Field(None, ge=0, description="with logprobs: the k most likely tokens "
                                                                      "at each position (k <= --max-logprobs)")

    ENDPOINT: ClassVar[str] = request_fields.CHAT

    @model_validator(mode="after")
    def _check_top_logprobs(self) -> "ChatCompletionRequest":
        if self.top_logprobs is not None and not self.logprobs:
            raise FieldError("top_logprobs", "needs logprobs: true")
        if self.continue_final_message and self.add_generation_prompt:
            raise FieldError("continue_final_message", "cannot be used with add_generation_prompt: true (its "
                                                       "default): send add_generation_prompt: false")
        return self

    def logprob_counts(self) -> tuple[int | None, int | None]:
        return (self.top_logprobs or 0) if self.logprobs else None, self.prompt_logprobs

    def prompt_chars(self) -> int:
        """Characters of the client's text the chat template may write (bounded by --max-prompt-chars)."""
        documents = sum(len(k) + len(v) for d in self.documents or () for k, v in d.items())
        return sum(m.chars() for m in self.messages) + documents

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class FieldError(ValueError):
    """A cross-field validation error; the app reports it as a 400 with ``param`` = field (see errors.py)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


# -- responses -------------------------------------------------------------------------------------


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogprobs(BaseModel):
    """The legacy completions layout: parallel lists, one entry per token (prompt tokens too with echo)."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's Logprob: a prompt position's entry for one token id."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "abort"]] = None
    stop_reason: Optional[Union[int, str]] = Field(None, description="vLLM extension: the stop string or token id")
    token_ids: Optional[list[int]] = Field(None, description="with return_token_ids")
    prompt_logprobs: Optional[list[Optional[dict[str, PromptLogprob]]]] = Field(
        None, description="with prompt_logprobs: per prompt token (the first null), token id -> its logprob")


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: Optional[list[ChatTokenLogprob]] = None
    refusal: Optional[list[ChatTokenLogprob]] = None


class ChatChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatLogprobs] = None
    finish_reason: Optional[Literal["stop", "length", "abort"]] = None
    stop_reason: Optional[Union[int, str]] = None
    token_ids: Optional[list[int]] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: UsageInfo
    prompt_logprobs: Optional[list[Optional[dict[str, PromptLogprob]]]] = Field(
        None, description="with prompt_logprobs: per prompt token (the first null), token id -> its logprob")


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "hyspec"
    root: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[Union[int, str]] = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class HealthResponse(BaseModel):
    status: Literal["ok", "draining", "failed"]
    detail: Optional[str] = None


# -- vLLM's tokenizer routes (/tokenize, /detokenize; hyspec.server.tokenization) ----------------------


class TokenizeCompletionRequest(_Strict):
    model: Optional[Text] = None
    prompt: Text
    add_special_tokens: StrictBool = Field(True, description="add the tokenizer's special tokens (its BOS)")
    return_token_strs: Optional[StrictBool] = Field(False, description="also return each token's text")


class DetokenizeRequest(_Strict):
    model: Optional[Text] = None
    tokens: list[Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]] = Field(
        description="token ids to turn into text")


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(BaseModel):
    prompt: str
