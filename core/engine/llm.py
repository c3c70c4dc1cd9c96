"""The offline API, shaped like vLLM's ``LLM``."""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import logging
from pathlib import Path
from typing import Any, Sequence as Seq

from tqdm.auto import tqdm

from hyspec import assets
from hyspec.engine import vllm_args
from hyspec.engine.engine import LLMEngine, PromptType
from hyspec.engine.outputs import RequestOutput
from hyspec.engine.parallel_sampling import SampleRequest, fan_out, select
from hyspec.engine.sampling_params import SamplingParams
from hyspec.errors import HyspecError, RequestError
from hyspec.model.chat_inputs import developer_as_system

log = logging.getLogger(__name__)
# LLMEngine's own keyword arguments, passed through as they are
_ENGINE_KEYWORDS = frozenset(inspect.signature(LLMEngine.__init__).parameters) - {"self", "model"}


class LLM:
    """Generate with a target model, optionally speculating.

    >>> llm = LLM()  # the default model (SmolLM2-135M-Instruct from its GGUF), plain decoding
    >>> llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    >>> out = llm.chat([{"role": "user", "content": "Write a haiku about CPUs."}])
    >>> out[0].outputs[0].text

    ``close()`` (or ``with LLM(...) as llm:``) stops what speculation runs beside the engine -- remote
    draft workers and their health thread, a rule-file watcher -- in order, while their runtimes are
    still up.  Without it they stop when the LLM is collected, or at interpreter exit before Ray's own
    shutdown.  Any number of LLMs may live in one process at once; each owns its engine and KV pool.

    ``engine_args``: LLMEngine's keywords, or vLLM's names for them (``gpu_memory_utilization=0.5`` is
    ``memory_fraction``, ``seed`` seeds the default generators, ``chat_template`` replaces the tokenizer's);
    a vLLM argument hyspec has not got is refused naming the reason (hyspec.engine.vllm_args), unless its
    value asks for nothing (``tensor_parallel_size=1``, ``trust_remote_code=False``).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        speculative_config: dict[str, Any] | str | None = None,
        backend: str = "auto",
        dtype: str = "auto",
        max_model_len: int | None = None,
        quantization: str | None = None,
        **engine_args: Any,
    ):
        if model is None:
            model = assets.default_model()  # looked up at the call: tests stand a tiny model in for it
        chat_template = engine_args.pop("chat_template", None)
        engine_args, seed = vllm_args.engine_kwargs(engine_args, _ENGINE_KEYWORDS)
        vllm_args.apply_seed(seed)
        self.engine = LLMEngine(model, backend=backend, dtype=vllm_args.normalize_dtype(dtype),
                                max_model_len=max_model_len, speculative_config=speculative_config,
                                quantization=quantization, **engine_args)
        self.tokenizer = self.engine.tokenizer  # None with skip_tokenizer_init=True
        if chat_template is not None:
            if self.tokenizer is None:
                raise RequestError("chat_template needs a tokenizer: not with skip_tokenizer_init=True")
            self.tokenizer.chat_template = chat_template
        self._ids = itertools.count()
        self._closed = False

    def get_tokenizer(self):
        return self.tokenizer

    def close(self) -> None:
        """Stop the drafters' threads and workers and free the KV cache (idempotent); generating afterwards
        is an error."""
        if not self._closed:
            self._closed = True
            self.engine.spec.close()
            self.engine.release_memory()

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prompt prefix (vLLM's name); False when ``enable_prefix_caching`` is off."""
        return self.engine.reset_prefix_cache()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this LLM was closed (close() or the end of its `with` block); create a new one")

    def generate(
        self,
        prompts: PromptType | Seq[PromptType],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in prompt order."""
        self._check_open()
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, Seq) and not isinstance(sampling_params, SamplingParams):
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise RequestError(f"{len(params)} sampling params for {len(prompts)} prompts")
        else:
            params = [sampling_params or SamplingParams()] * len(prompts)
        groups: list[tuple[SamplingParams, list[str]]] = []  # per prompt: its params and sample ids
        added: list[str] = []
        try:
            for prompt, p in zip(prompts, params):
                rid = str(next(self._ids))
                samples = fan_out(rid, p) if isinstance(p, SamplingParams) else [SampleRequest(rid, p, None)]
                for s in samples:
                    added.append(self.engine.add_request(prompt, s.params, s.request_id, s.share_prompt_with)
                                 .request_id)
                groups.append((p, [s.request_id for s in samples]))
        except Exception:
            for rid in added:  # a bad prompt in the list: leave the engine as it was
                self.engine.abort_request(rid)
            raise
        finals = self._run(added, use_tqdm)
        return [_gather(p, [finals[i] for i in ids]) for p, ids in groups]

    def chat(
        self,
        messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
        sampling_params: SamplingParams | None = None,
        use_tqdm: bool = False,
        *,  # vLLM's next positional parameters (lora_request, priority) are not hyspec's: by keyword from here
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Apply the chat template and generate (one conversation or a list of them), as vLLM's ``LLM.chat``.

        ``chat_template``: the template text to use instead of the tokenizer's.  ``continue_final_message``
        leaves the final message open for the model to continue (with ``add_generation_prompt=False``).
        ``tools``: JSON schemas rendered into the prompt by templates that take them (the output is text: no
        tool-call parsing).  ``chat_template_kwargs``: more template variables, e.g. Qwen3's
        ``{"enable_thinking": False}``.  The template is rendered as transformers renders it
        (hyspec.model.chat_inputs), after vLLM's mapping of ``developer`` messages to ``system`` for templates
        that do not name that role; a template that raises is a RequestError with its message."""
        if self.tokenizer is None:
            raise RequestError("chat needs a tokenizer: this LLM was created with skip_tokenizer_init=True")
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = []
        template = self.tokenizer.chat_template_for(chat_template, tools)
        for conversation in conversations:
            if isinstance(conversation, list) and all(isinstance(m, dict) for m in conversation):
                conversation = developer_as_system(conversation, template or "")  # as vLLM's LLM.chat does
            try:
                text = self.tokenizer.apply_chat_template(
                    conversation, add_generation_prompt=add_generation_prompt, chat_template=chat_template,
                    continue_final_message=continue_final_message, tools=tools,
                    chat_template_kwargs=chat_template_kwargs)
            except HyspecError as exc:
                raise RequestError(str(exc)) from None
            # The template already wrote any BOS it wants: do not add special tokens again.
            prompts.append({"prompt": text, "prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> dict[str, RequestOutput]:
        final: dict[str, RequestOutput] = {}
        bar = tqdm(total=len(ids), desc="generating", disable=not use_tqdm)
        pending = set(ids)
        while pending:
            for out in self.engine.step():
                if out.finished and out.request_id in pending:
                    final[out.request_id] = out
                    pending.discard(out.request_id)
                    bar.update(1)
            if pending and not self.engine.has_unfinished_requests():
                raise RuntimeError(f"engine idle with unfinished requests {sorted(pending)[:3]}")
        bar.close()
        return final


def _gather(params: SamplingParams, samples: list[RequestOutput]) -> RequestOutput:
    """One request's answer from its samples' (a single sample is returned as it is)."""
    if len(samples) == 1:
        return samples[0]
    first = samples[0]
    return dataclasses.replace(first, request_id=first.request_id.rsplit("-s", 1)[0],
                               outputs=select(params, [s.outputs[0] for s in samples]),
                               finished=all(s.finished for s in samples))
