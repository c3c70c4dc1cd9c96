"""/v1/completions and /v1/chat/completions: prompts in, engine requests, OpenAI responses or SSE out.

Everything that can be refused is refused before the first byte is sent:
prompts are tokenized and measured, sampling parameters built and the engine
requests accepted, so a bad request is a 400 and never a stream that ends in
an error.  A stream then sends one ``data: {chunk}`` event per engine step
that produced text, and ends with ``data: [DONE]``.  A client that goes away
(stream closed, or connection dropped while waiting for a non-streamed
answer) has its requests aborted, which frees their KV at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Iterable, Sequence, TypeVar

from hyspec.engine.outputs import CompletionOutput, RequestOutput
from hyspec.engine.parallel_sampling import fan_out, select
from hyspec.engine.sampling_params import SamplingParams
from hyspec.errors import HyspecError, RequestError
from hyspec.model.chat_inputs import ChatInputError, developer_as_system
from hyspec.server.async_engine import AsyncEngine, RequestAbortedError, RequestStream, ServiceUnavailableError
from hyspec.server.errors import APIError, request_error_param, sse_error
from hyspec.server.logprobs_format import CompletionLogprobBuilder, chat_logprobs, prompt_logprobs
from hyspec.server.protocol import (ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs,
                                    ChatResponseMessage, CompletionChoice, CompletionLogprobs, CompletionRequest,
                                    CompletionResponse, UsageInfo)

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# Default bound on a request's prompt text, per token of context: no tokenizer's tokens average anywhere near
# this many characters, so a prompt past it cannot fit and is refused before the tokenizer spends time on it.
PROMPT_CHARS_PER_TOKEN = 64
CHAT_TEMPLATE_TIMEOUT_S = 5.0  # a real chat template renders in milliseconds
DONE = "data: [DONE]\n\n"


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready."""


@dataclass
class Prompt:
    text: str | None
    token_ids: list[int]

    def engine_input(self) -> dict[str, Any]:
        return {"prompt": self.text, "prompt_token_ids": self.token_ids}


class OpenAIServing:
    """The two generating routes.  What one request may take, each bound a 400 naming it:

    ``max_tokens``: the most tokens one request may generate (None: the context).
    ``max_prompt_chars``: characters of prompt text (all prompts, or all messages) one request may send,
    checked before tokenizing (default: PROMPT_CHARS_PER_TOKEN per token of context).
    ``max_n``: completions per prompt (``n``, ``best_of``) one request may ask for (default: a quarter of
    max_num_seqs, at least 1), so that no single request takes the whole batch.
    ``split_special_tokens_in_content``: control-token text in chat content from other roles than system and
    developer is tokenized as text (Tokenizer.encode_chat), so that a user cannot write a turn of another role.
    """

    def __init__(self, async_engine: AsyncEngine, served_model_name: str, max_tokens: int | None = None,
                 max_prompt_chars: int | None = None, max_n: int | None = None,
                 split_special_tokens_in_content: bool = True, other_names: Sequence[str] = ()):
        for name, value in (("max_tokens", max_tokens), ("max_prompt_chars", max_prompt_chars), ("max_n", max_n)):
            if value is not None and value < 1:
                raise ValueError(f"{name} (a per-request ceiling) must be >= 1, got {value}")
        self.max_tokens_ceiling = max_tokens  # --max-tokens: the most any one request may generate
        self.async_engine = async_engine
        self.engine = async_engine.engine
        self.served_model_name = served_model_name
        self.served_model_names = (served_model_name, *other_names)  # all accepted as `model`; the first reported
        self.max_model_len: int = self.engine.max_model_len
        self.vocab_size: int = self.engine.config.vocab_size
        self.tokenizer = self.engine.tokenizer  # read-only and thread-safe: used off the engine thread
        if self.tokenizer is None:
            raise HyspecError("the server needs the model's tokenizer: start the engine without skip_tokenizer_init")
        self.max_logprobs: int = self.engine.max_logprobs
        self.prompt_chars_configured = max_prompt_chars is not None
        self.max_prompt_chars: int = max_prompt_chars or PROMPT_CHARS_PER_TOKEN * self.max_model_len
        self.max_n: int = max_n or max(1, async_engine.engine.scheduler.config.max_num_seqs // 4)
        self.split_special_tokens_in_content = split_special_tokens_in_content

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.served_model_names:
            raise APIError(404, f"the model `{name}` does not exist; this server serves `{self.served_model_name}`",
                           param="model", code="model_not_found")

    # -- /v1/completions ---------------------------------------------------------------------------

    async def completions(self, req: CompletionRequest, raw_request: Any):
        self.check_model(req.model)
        self._check_logprobs(req.logprobs, "logprobs")
        self._check_logprobs(req.prompt_logprobs, "prompt_logprobs")
        self._check_prompt_chars(sum(len(p) for p in _texts(req.prompt)), "prompt")
        prompts = await asyncio.to_thread(self._completion_prompts, req.prompt, req.add_special_tokens)
        if "max_tokens" in req.model_fields_set:  # an explicit null: up to the context (under --max-tokens)
            max_tokens = self._max_tokens(req.max_tokens, "max_tokens", prompts)
        else:  # absent: OpenAI's default of 16, never above the ceiling
            max_tokens = min(16, self.max_tokens_ceiling or 16)
        params = _sampling_params(req, max_tokens)
        self._check_fan_out(len(prompts), params)
        for p in prompts:
            self._check_length(p, max_tokens, "prompt", "max_tokens")
        request_id = f"cmpl-{uuid.uuid4().hex}"
        streams = await self._submit(prompts, params, request_id)
        created = int(time.time())
        if req.stream:
            return _sse(self._completion_events(req, request_id, created, prompts, streams))
        finals = await self._collect(streams, raw_request)
        choices = []
        for i, (prompt, outs) in enumerate(zip(prompts, _per_prompt(finals, params.num_samples))):
            for out in select(params, [o.outputs[0] for o in outs]):
                echo = self._echo(prompt, outs[0]) if req.echo else None
                choices.append(CompletionChoice(
                    index=i * params.n + out.index, text=(echo[0] if echo else "") + out.text,
                    logprobs=self._completion_logprobs(req, out, echo), finish_reason=out.finish_reason,
                    stop_reason=out.stop_reason, token_ids=out.token_ids if req.return_token_ids else None,
                    prompt_logprobs=self._prompt_logprobs(req, outs[0])))
        return CompletionResponse(id=request_id, created=created, model=self.served_model_name, choices=choices,
                                  usage=_usage(prompts, finals))

    def _echo(self, prompt: Prompt, out: RequestOutput) -> tuple[str, list[int], list | None]:
        """(text, ids, logprobs) of the prompt, for ``echo``."""
        text = prompt.text if prompt.text is not None else self.tokenizer.decode(prompt.token_ids,
                                                                                 skip_special_tokens=False)
        return text, prompt.token_ids, out.prompt_logprobs

    def _completion_logprobs(self, req: CompletionRequest, out: CompletionOutput,
                             echo: tuple[str, list[int], list | None] | None) -> CompletionLogprobs | None:
        if req.logprobs is None:
            return None
        builder = CompletionLogprobBuilder(self._text_for(req), req.logprobs)
        parts = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        if echo is not None:
            _, ids, prompt_logprobs = echo
            _extend(parts, builder.entries(ids, prompt_logprobs or [None] * len(ids)))
        _extend(parts, builder.entries(out.token_ids, out.logprobs or []))
        return CompletionLogprobs(**parts)

    def _prompt_logprobs(self, req: Any, out: RequestOutput) -> list | None:
        """vLLM's ``prompt_logprobs`` of a response, when the request asked for them."""
        if req.prompt_logprobs is None:
            return None
        return prompt_logprobs(out.prompt_logprobs, lambda t: self.tokenizer.decode([t], skip_special_tokens=False))

    def _text_for(self, req: Any):
        """How logprob entries name tokens: their text, or ``token_id:N`` (vLLM's return_tokens_as_token_ids)."""
        if req.return_tokens_as_token_ids:
            return _token_id_text
        return lambda token_id: self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _completion_prompts(self, prompt: Any, add_special_tokens: bool = True) -> list[Prompt]:
        if isinstance(prompt, str):
            items: list[Any] = [prompt]
        elif prompt and isinstance(prompt[0], int):
            items = [prompt]
        else:
            items = list(prompt)
        out = []
        for item in items:
            if isinstance(item, str):
                out.append(Prompt(item, self.tokenizer.encode(item, add_special_tokens=add_special_tokens)))
            else:
                if any(t < 0 or t >= self.vocab_size for t in item):
                    raise APIError(400, f"prompt: token ids must be in [0, {self.vocab_size})", param="prompt")
                out.append(Prompt(None, list(item)))
        if len(out) > self.async_engine.capacity:
            raise APIError(400, f"prompt: {len(out)} prompts in one request; this server takes at most "
                                f"{self.async_engine.capacity} requests at once", param="prompt")
        return out

    async def _completion_events(self, req: CompletionRequest, request_id: str, created: int,
                                 prompts: list[Prompt], streams: list[RequestStream]) -> AsyncIterator[str]:
        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
            body: dict[str, Any] = {"id": request_id, "object": "text_completion", "created": created,
                                    "model": self.served_model_name, "choices": choices}
            if req.include_usage or usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        n = len(streams) // len(prompts)  # samples per prompt; stream k is prompt k // n, choice k
        completion_tokens = [0] * len(streams)
        builders = [CompletionLogprobBuilder(self._text_for(req), req.logprobs) if req.logprobs is not None else None
                    for _ in streams]
        echoed = [not req.echo] * len(streams)
        try:
            async with contextlib.aclosing(_merge(streams)) as outputs:
                async for index, out in outputs:
                    completion_tokens[index] = len(out.outputs[0].token_ids)
                    text, logprobs = out.new_text, None
                    if builders[index] is not None:
                        logprobs = builders[index].entries(out.new_token_ids, out.new_logprobs)
                    if not echoed[index]:  # the prompt goes out with the choice's first chunk
                        echoed[index] = True
                        ptext, pids, plogprobs = self._echo(prompts[index // n], out)
                        text = ptext + text
                        if builders[index] is not None:
                            prompt_part = CompletionLogprobBuilder(self._text_for(req), req.logprobs).entries(
                                pids, plogprobs or [None] * len(pids))
                            builders[index].offset += len(ptext)
                            for entry in logprobs["text_offset"]:
                                prompt_part["text_offset"].append(entry + len(ptext))
                            for key in ("token_logprobs", "tokens", "top_logprobs"):
                                prompt_part[key] += logprobs[key]
                            logprobs = prompt_part
                    if not (text or out.finished or (req.return_token_ids and out.new_token_ids)
                            or (logprobs and logprobs["tokens"])):
                        continue  # an incomplete UTF-8 character: its text comes with the next token
                    choice: dict[str, Any] = {
                        "index": index, "text": text, "logprobs": logprobs,
                        "finish_reason": out.outputs[0].finish_reason if out.finished else None,
                        "stop_reason": out.outputs[0].stop_reason if out.finished else None}
                    if req.return_token_ids:
                        choice["token_ids"] = out.new_token_ids
                    usage = _usage_dict(prompts, completion_tokens) if req.continuous_usage else None
                    yield chunk([choice], usage)
            if req.include_usage:
                yield chunk([], _usage_dict(prompts, completion_tokens))
        except Exception as exc:  # the engine failed or the server shut down mid-stream
            yield sse_error(_status_of(exc), str(exc))
        finally:
            for s in streams:
                s.abort()  # a no-op for finished requests; frees the KV of a client that left
        yield DONE

    # -- /v1/chat/completions ----------------------------------------------------------------------

    async def chat(self, req: ChatCompletionRequest, raw_request: Any):
        self.check_model(req.model)
        self._check_logprobs(req.top_logprobs, "top_logprobs")
        self._check_logprobs(req.prompt_logprobs, "prompt_logprobs")
        self._check_prompt_chars(req.prompt_chars(), "messages")
        prompt = await asyncio.to_thread(self._chat_prompt, req)
        max_field = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = self._max_tokens(req.requested_max_tokens, max_field, [prompt])
        params = _sampling_params(req, max_tokens)
        self._check_fan_out(1, params)
        self._check_length(prompt, max_tokens, "messages", max_field)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self._submit([prompt], params, request_id)
        created = int(time.time())
        if req.stream:
            return _sse(self._chat_events(req, request_id, created, prompt, streams))
        finals = await self._collect(streams, raw_request)
        top_k = req.top_logprobs or 0
        choices = [ChatChoice(index=out.index, message=ChatResponseMessage(content=out.text),
                              logprobs=ChatLogprobs(content=chat_logprobs(out.token_ids, out.logprobs, self._text_for(req),
                                                                          top_k)) if req.logprobs else None,
                              finish_reason=out.finish_reason, stop_reason=out.stop_reason,
                              token_ids=out.token_ids if req.return_token_ids else None)
                   for out in select(params, [f.outputs[0] for f in finals])]
        return ChatCompletionResponse(id=request_id, created=created, model=self.served_model_name,
                                      choices=choices, usage=_usage([prompt], finals),
                                      prompt_logprobs=self._prompt_logprobs(req, finals[0]))

    def _chat_prompt(self, req: ChatCompletionRequest) -> Prompt:
        messages = [{"role": m.role, "content": m.text(),
                     **{k: getattr(m, k) for k in ("name", "reasoning", "reasoning_content") if getattr(m, k)}}
                    for m in req.messages]
        messages = developer_as_system(messages, self.tokenizer.chat_template or "")  # as vLLM renders them
        try:
            # The template writes any BOS it wants; no special tokens are added again (as LLM.chat does).
            text, ids = self.tokenizer.encode_chat(
                messages, add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message, chat_template_kwargs=req.chat_template_kwargs,
                documents=req.documents,
                split_special_tokens_in_content=self.split_special_tokens_in_content,
                # the messages' text (checked against max_prompt_chars) plus the template's own
                max_output_chars=2 * self.max_prompt_chars + (64 << 10), timeout_s=CHAT_TEMPLATE_TIMEOUT_S)
        except ChatInputError as exc:
            raise APIError(400, str(exc), param=exc.field) from None
        except HyspecError as exc:  # the template failed (its raise_exception's message) or passed a bound
            raise APIError(400, f"messages: {exc}", param="messages") from None
        return Prompt(text, ids)

    async def _chat_events(self, req: ChatCompletionRequest, request_id: str, created: int, prompt: Prompt,
                           streams: list[RequestStream]) -> AsyncIterator[str]:
        def chunk(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
            body: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                                    "model": self.served_model_name, "choices": choices}
            if req.include_usage or usage is not None:
                body["usage"] = usage
            return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

        completion_tokens = [0] * len(streams)
        try:
            for index in range(len(streams)):
                yield chunk([{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])
            async with contextlib.aclosing(_merge(streams)) as outputs:
                async for index, out in outputs:
                    completion_tokens[index] = len(out.outputs[0].token_ids)
                    logprobs = None
                    if req.logprobs and out.new_token_ids:
                        logprobs = {"content": chat_logprobs(out.new_token_ids, out.new_logprobs, self._text_for(req),
                                                             req.top_logprobs or 0)}
                    if not (out.new_text or out.finished or (req.return_token_ids and out.new_token_ids)
                            or logprobs):
                        continue
                    delta: dict[str, Any] = {"content": out.new_text} if out.new_text else {}
                    if req.return_token_ids:
                        delta["token_ids"] = out.new_token_ids
                    choice = {"index": index, "delta": delta, "logprobs": logprobs,
                              "finish_reason": out.outputs[0].finish_reason if out.finished else None,
                              "stop_reason": out.outputs[0].stop_reason if out.finished else None}
                    usage = _usage_dict([prompt], completion_tokens) if req.continuous_usage else None
                    yield chunk([choice], usage)
            if req.include_usage:
                yield chunk([], _usage_dict([prompt], completion_tokens))
        except Exception as exc:
            yield sse_error(_status_of(exc), str(exc))
        finally:
            for s in streams:
                s.abort()
        yield DONE

    # -- shared --------------------------------------------------------------------------------------

    def _max_tokens(self, asked: int | None, field: str, prompts: list[Prompt]) -> int | None:
        """What a request may generate: what it asked for (None: up to the context), under --max-tokens.

        Asking for more than the ceiling is a 400 naming it; asking for nothing means the ceiling, or
        less where the longest prompt leaves less room in the context (never a 400 for what the client
        did not ask)."""
        ceiling = self.max_tokens_ceiling
        if ceiling is None:
            return asked
        if asked is not None:
            if asked > ceiling:
                raise APIError(400, f"{field}: {asked} tokens requested; this server generates at most {ceiling} "
                                    "tokens per request (--max-tokens)", param=field)
            return asked
        room = self.max_model_len - max((len(p.token_ids) for p in prompts), default=0)
        return max(1, min(ceiling, room))  # an over-long prompt is _check_length's 400

    def _check_length(self, prompt: Prompt, max_tokens: int | None, prompt_field: str, max_field: str) -> None:
        n, limit = len(prompt.token_ids), self.max_model_len
        if n == 0:
            raise APIError(400, f"{prompt_field}: the prompt is empty (it has no tokens)", param=prompt_field)
        if n >= limit:
            raise APIError(400, f"{prompt_field}: the prompt has {n} tokens; this model's maximum context length is "
                                f"{limit} tokens (the prompt plus at least one generated token must fit)",
                           param=prompt_field)
        if max_tokens is not None and n + max_tokens > limit:
            raise APIError(400, f"{max_field}: {max_tokens} tokens requested after a {n}-token prompt; this model's "
                                f"maximum context length is {limit} tokens, so at most {limit - n} can be generated",
                           param=max_field)

    def _check_logprobs(self, k: int | None, field: str) -> None:
        if k is not None and k > self.max_logprobs:
            raise APIError(400, f"{field}: {k} requested; this server returns at most {self.max_logprobs} "
                                "(--max-logprobs)", param=field)

    def _check_prompt_chars(self, chars: int, field: str) -> None:
        limit = self.max_prompt_chars
        if chars > limit:
            why = "--max-prompt-chars" if self.prompt_chars_configured else (
                f"{PROMPT_CHARS_PER_TOKEN} per token of this model's maximum context length, {self.max_model_len} "
                "tokens; --max-prompt-chars")
            raise APIError(400, f"{field}: {chars} characters of prompt; this server takes at most {limit} characters "
                                f"per request ({why})", param=field)

    def _check_fan_out(self, num_prompts: int, params: SamplingParams) -> None:
        """Every sample is an engine request: at most max_n per prompt, and all of them must fit the server."""
        if params.num_samples > self.max_n:
            field = "best_of" if params.best_of is not None and params.best_of > params.n else "n"
            raise APIError(400, f"{field}: {params.num_samples} completions per prompt; this server takes at most "
                                f"{self.max_n} per request (--max-n)", param=field)
        total = num_prompts * params.num_samples
        if total > self.async_engine.capacity:
            field = "best_of" if params.best_of is not None and params.best_of > params.n else "n"
            raise APIError(400, f"{field}: {total} completions in one request; this server takes at most "
                                f"{self.async_engine.capacity} requests at once", param=field)
        self.async_engine.check_capacity(total)  # fail fast, before any engine work

    async def _submit(self, prompts: list[Prompt], params: SamplingParams, request_id: str) -> list[RequestStream]:
        """One engine request per prompt and sample (prompt-major: stream k is prompt k // samples)."""
        items = [(p.engine_input(), s.params, s.request_id, s.share_prompt_with)
                 for i, p in enumerate(prompts) for s in fan_out(f"{request_id}-{i}", params)]
        try:
            return await self.async_engine.add_requests(items)
        except RequestError as exc:
            raise APIError(400, str(exc), param=request_error_param(str(exc))) from None

    async def _collect(self, streams: list[RequestStream], raw_request: Any) -> list[RequestOutput]:
        """The final output of every stream, aborting them all if the client disconnects first.

        The first error of any stream raises (the server shutting down: ShutdownAbortError, a 503)."""
        async def finals() -> list[RequestOutput]:
            last: list[RequestOutput | None] = [None] * len(streams)
            async with contextlib.aclosing(_merge(streams)) as outputs:
                async for index, out in outputs:
                    last[index] = out
            assert all(out is not None and out.finished for out in last)
            return last

        try:
            return await _until_disconnected(raw_request, finals())
        finally:
            for s in streams:
                s.abort()


def _sampling_params(req: CompletionRequest | ChatCompletionRequest, max_tokens: int | None) -> SamplingParams:
    try:
        return req.sampling_params(max_tokens)
    except RequestError as exc:
        raise APIError(400, str(exc), param=request_error_param(str(exc))) from None


def _texts(prompt: Any) -> list[str]:
    """The text prompts of a completion request's ``prompt`` (a string, token ids, or a list of either)."""
    if isinstance(prompt, str):
        return [prompt]
    return [p for p in prompt if isinstance(p, str)] if isinstance(prompt, list) else []


def _token_id_text(token_id: int) -> str:
    return f"token_id:{token_id}"


def _per_prompt(finals: list[RequestOutput], samples: int) -> list[list[RequestOutput]]:
    return [finals[i:i + samples] for i in range(0, len(finals), samples)]


def _extend(parts: dict[str, list[Any]], more: dict[str, list[Any]]) -> None:
    for key, values in more.items():
        parts[key] += values


def _usage(prompts: list[Prompt], finals: list[RequestOutput]) -> UsageInfo:
    """Each prompt counts once (its samples share one prefill); every sample's tokens count (best_of too)."""
    return UsageInfo(**_usage_dict(prompts, [len(o.outputs[0].token_ids) for o in finals]))


def _usage_dict(prompts: list[Prompt], completion_tokens: list[int]) -> dict[str, int]:
    prompt_tokens = sum(len(p.token_ids) for p in prompts)
    completion = sum(completion_tokens)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}


def _status_of(exc: Exception) -> int:
    """The HTTP status an error inside an already started stream would have had."""
    if isinstance(exc, (RequestAbortedError, ServiceUnavailableError)):
        return 503
    if isinstance(exc, HyspecError):
        return 400
    return 500


def _sse(events: AsyncIterator[str]):
    from fastapi.responses import StreamingResponse

    return StreamingResponse(events, media_type="text/event-stream", headers=SSE_HEADERS)


async def _merge(streams: list[RequestStream]) -> AsyncIterator[tuple[int, RequestOutput]]:
    """(index, output) from several streams as they come; each stream's outputs stay in order."""
    pending = {asyncio.ensure_future(s.__anext__()): i for i, s in enumerate(streams)}
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                index = pending.pop(task)
                try:
                    out = task.result()
                except StopAsyncIteration:
                    continue
                yield index, out
                pending[asyncio.ensure_future(streams[index].__anext__())] = index
    finally:
        _discard(pending)  # after an error (or the consumer leaving) other streams' reads may have failed too


async def _until_disconnected(raw_request: Any, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it (and raising ClientDisconnected) if the HTTP client goes away first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(raw_request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        _discard([watcher] if task.done() else [watcher, task])
    if task.done():
        return task.result()
    raise ClientDisconnected()


def _discard(futures: Iterable[asyncio.Future]) -> None:
    """Cancel futures nobody will await, and mark each one's outcome as seen once it is done: asyncio logs
    "exception was never retrieved", with a traceback, for a failed future that nobody looked at."""
    for future in futures:
        future.cancel()
        future.add_done_callback(_mark_retrieved)


def _mark_retrieved(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()


async def _wait_for_disconnect(raw_request: Any) -> None:
    # The body has been read; the next ASGI message is the disconnect (uvicorn sends it when the socket closes).
    while True:
        message = await raw_request.receive()
        if message["type"] == "http.disconnect":
            return
