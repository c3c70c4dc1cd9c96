"""vLLM's engine and server arguments, each implemented by hyspec (under which name) or refused (why).

The one table behind ``hyspec serve`` / ``generate`` / ``chat``'s vLLM flags (hyspec.cli.model_args builds
them from it), ``LLM(**kwargs)`` (:func:`engine_kwargs`) and docs/vllm_compat.md (scripts/gen_vllm_compat_doc.py).
Every argument of vLLM's ``vllm serve`` parser and of its ``LLM()`` is listed (``vllm_schemas.json``, read
from the installed vLLM by scripts/gen_vllm_schemas.py; tests/engine/test_vllm_args.py holds the two equal).

There are two states, never a third: :class:`Implemented` (mapped onto hyspec's option ``dest``) and
:class:`Refused` (an error naming the argument and the reason).  A refused argument still passes when its
value asks for nothing (None, False -- the ``--no-`` spelling) or for exactly what hyspec does
(``Refused.accepts``: ``--tensor-parallel-size 1``; ``--enable-chunked-prefill``, where ``--no-`` is refused).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from hyspec.errors import ConfigError

SCHEMAS = Path(__file__).with_name("vllm_schemas.json")


@dataclass(frozen=True)
class Implemented:
    """hyspec has it: the value goes to ``dest`` (an LLMEngine keyword, ``serve.NAME`` for a server option,
    or ``seed``) after ``convert``."""

    dest: str
    note: str = ""

    @property
    def serve_only(self) -> bool:
        return self.dest.startswith("serve.")


@dataclass(frozen=True)
class Refused:
    """hyspec has not got it: any value but None, False or one of ``accepts`` is an error giving ``reason``.
    When ``accepts`` holds True (a behaviour hyspec always has, e.g. chunked prefill), False asks to turn it
    off, and is refused too."""

    reason: str
    accepts: tuple[Any, ...] = ()

    def allows(self, value: Any) -> bool:
        if value is False:
            return True not in self.accepts
        return value is None or any(value == a and type(value) is type(a) for a in self.accepts) or (
            isinstance(value, (list, tuple, dict, set)) and not value)


Arg = Implemented | Refused

# -- reasons shared by many arguments ----------------------------------------------------------------------
ONE_DEVICE = "hyspec runs each engine on one device (no tensor, pipeline, data, context or expert parallelism)"
MULTIMODAL = "hyspec serves text-only decoder models: no images, audio or video inputs"
LORA = "hyspec does not load LoRA adapters"
MOE = "hyspec's models are dense decoders (Llama/Qwen/SmolLM families): no mixture-of-experts machinery"
MAMBA = "hyspec's models are attention decoders: no Mamba / state-space layers"
HUB = ("hyspec loads a local Hugging Face directory or GGUF file and never downloads from the Hub "
       "(fetch it first, e.g. `huggingface-cli download`)")
REMOTE_CODE = "hyspec never runs a checkpoint's own Python code: it implements each architecture itself"
CUDA_KERNELS = ("a vLLM kernel or compiler choice: hyspec picks its own kernels per backend "
                "(hyspec probe lists them)")
KV_TRANSFER = "hyspec has no disaggregated prefill, KV offloading or KV connectors"
OFFLOAD = "hyspec keeps the weights on the device: no CPU offloading of weights"
TRACING = "hyspec exports Prometheus metrics (/metrics) only: no OpenTelemetry, profiler or NVTX hooks"
POOLING = "hyspec generates text: no pooling / embedding / reward runners"
SLEEP = "hyspec has no sleep mode (free an LLM with close())"
PLUGINS = "hyspec loads no plugins or user classes into its engine"
TOOLS = ("tool calling needs a model-specific parser (Hermes, Llama-3 JSON, Qwen) that hyspec has not got; "
         "`tools` requests are refused")
REASONING = "hyspec has no reasoning parsers: the model's thinking stays in the text"
TLS = "hyspec serves plain HTTP: terminate TLS at a reverse proxy (nginx, Caddy) in front of it"
CORS = "hyspec adds no CORS headers: browsers reach it through a same-origin proxy"
OTHER_APIS = "hyspec serves the OpenAI completions and chat APIs only (no Anthropic / Cohere / gRPC front ends)"
SCHEDULER = "hyspec's scheduler is fixed: first come first served, prefills chunked by --max-num-batched-tokens"
LOGGING = "hyspec does not log requests or periodic stats: the Prometheus metrics (/metrics) carry the counts"
SINGLE_PROCESS = "hyspec serves from one process with one engine: no API-server processes or headless engines"
SPEC_KEYS = "give it inside --speculative-config (vLLM's JSON: method, model, num_speculative_tokens)"


def _each(arg: Arg, *names: str) -> dict[str, Arg]:
    return {name: arg for name in names}


ENGINE_ARGS: dict[str, Arg] = {
    # implemented
    "model": Implemented("model", "a Hugging Face directory or a GGUF file; also the positional MODEL"),
    "tokenizer": Implemented("tokenizer"),
    "skip_tokenizer_init": Implemented("skip_tokenizer_init"),
    "dtype": Implemented("dtype", "auto, float32, float16, bfloat16 (vLLM's half, float accepted)"),
    "seed": Implemented("seed", "seeds the process's default random generators (torch, random, numpy), "
                                "which sample the requests that carry no seed of their own"),
    "max_model_len": Implemented("max_model_len"),
    "block_size": Implemented("block_size"),
    "enable_prefix_caching": Implemented("enable_prefix_caching", "off by default here"),
    "enforce_eager": Implemented("enforce_eager"),
    "gpu_memory_utilization": Implemented("memory_fraction", "the share of device memory hyspec may use"),
    "kv_cache_memory_bytes": Implemented("kv_cache_bytes"),
    "max_num_seqs": Implemented("max_num_seqs"),
    "max_num_batched_tokens": Implemented("max_num_batched_tokens"),
    "max_logprobs": Implemented("max_logprobs"),
    "logprobs_mode": Implemented("logprobs_mode", "raw_logprobs and processed_logprobs"),
    "quantization": Implemented("quantization", "hyspec's weight kernels: none, int4, int8, a8 (a GGUF's own codes "
                                                "by default); vLLM's awq/gptq/fp8 formats are refused by the engine"),
    "speculative_config": Implemented("speculative_config", "vLLM's JSON plus hyspec's keys"),
    "cudagraph_capture_sizes": Implemented("cuda_graph_sizes", "batch sizes the CUDA backend captures"),
    "served_model_name": Implemented("serve.served_model_name", "several names: any of them is accepted, "
                                                                "the first is reported"),
    "shutdown_timeout": Implemented("serve.shutdown_timeout", "seconds in-flight requests get after SIGTERM"),
    "log_level": Implemented("serve.log_level"),
    # refused unless they ask for what hyspec does
    "tensor_parallel_size": Refused(ONE_DEVICE, (1,)),
    "pipeline_parallel_size": Refused(ONE_DEVICE, (1,)),
    "data_parallel_size": Refused(ONE_DEVICE, (1,)),
    "prefill_context_parallel_size": Refused(ONE_DEVICE, (1,)),
    "decode_context_parallel_size": Refused(ONE_DEVICE, (1,)),
    "nnodes": Refused(ONE_DEVICE, (1,)),
    "node_rank": Refused(ONE_DEVICE, (0,)),
    "trust_remote_code": Refused(REMOTE_CODE),
    "enable_chunked_prefill": Refused("hyspec always chunks long prefills (--max-num-batched-tokens per step); "
                                      "it cannot be turned off", (True,)),
    "kv_cache_dtype": Refused("hyspec's KV cache has the model's dtype (no fp8 KV cache)", ("auto",)),
    "load_format": Refused("hyspec reads safetensors directories and GGUF files, picking by the path", ("auto",)),
    "tokenizer_mode": Refused("hyspec uses the checkpoint's tokenizer.json (or the GGUF's vocabulary)", ("auto",)),
    "config_format": Refused("hyspec reads config.json (or the GGUF's metadata)", ("auto", "hf")),
    "runner": Refused(POOLING, ("auto", "generate")),
    "convert": Refused(POOLING, ("auto", "none")),
    "generation_config": Refused("hyspec takes sampling defaults from each request only, never from the "
                                 "checkpoint's generation_config.json", ("vllm",)),
    "override_generation_config": Refused("hyspec takes sampling defaults from each request only"),
    "scheduling_policy": Refused(SCHEDULER, ("fcfs",)),
    "use_tqdm_on_load": Refused("hyspec shows no progress bar while loading"),
    "disable_log_stats": Refused("hyspec logs no periodic stats (they are in /metrics): --disable-log-stats asks for "
                                 "what it does already; asking for stats logs is refused", (True,)),
    "logits_processors": Refused("hyspec's per-request processors are its sampling fields (penalties, logit_bias, "
                                 "...), applied at every verified position; it loads no user classes"),
    "allowed_local_media_path": Refused(MULTIMODAL, ("",)),
    "hf_overrides": Refused("hyspec reads the checkpoint's config.json as it is"),
    "model_class_overrides": Refused(REMOTE_CODE),
    "additional_config": Refused(PLUGINS),
    "structured_outputs_config": Refused("structured outputs are chosen per request (response_format / "
                                         "structured_outputs fields); there is no server-wide backend to pick"),
    "reasoning_config": Refused(REASONING),
    "spec_method": Refused(SPEC_KEYS), "spec_model": Refused(SPEC_KEYS), "spec_tokens": Refused(SPEC_KEYS),
    "stream_interval": Refused("hyspec streams every engine step's tokens as they come", (1,)),
    "async_scheduling": Refused("hyspec's engine steps synchronously (drafting and verification share a step)"),
    "optimization_level": Refused(CUDA_KERNELS),
    "performance_mode": Refused(CUDA_KERNELS, ("balanced",)),
    "max_parallel_loading_workers": Refused("hyspec loads the weights in its own process"),
    "tokens_only": Refused("hyspec's server renders and detokenizes in the engine's process"),
    "fail_on_environ_validation": Refused("hyspec does not validate VLLM_* environment variables"),
    "disable_sliding_window": Implemented("disable_sliding_window", "every layer attends fully and max_model_len "
                                                                    "is capped to the window (vLLM 0.32's rule)"),
    "swa_bounded_replay": Refused("bounded replay is vLLM's prefix caching of DeepSeek-V4.1's sliding-window KV, an "
                                  "architecture hyspec does not load; hyspec keeps windowed layers' KV whole",
                                  (True,)),
    "enable_prompt_embeds": Refused("hyspec takes text or token ids as prompts, not embeddings"),
    "watermark": Refused("hyspec has no output watermarking", (0, 0.0)),
    "watermark_config": Refused("hyspec has no output watermarking"),
    "enable_return_routed_experts": Refused(MOE),
    "return_sampling_mask": Refused("hyspec does not return sampling masks"),
    "use_fp64_gumbel": Refused("hyspec samples with its own sampler (float32 probabilities)"),
    "enable_trace_replay": Refused(TRACING),
    "hf_config_path": Refused("hyspec reads config.json from the model directory itself"),
    "model_weights": Refused("hyspec reads the weights from the model directory or GGUF file itself"),
    "prefix_caching_hash_algo": Refused("hyspec's prefix cache compares token pages itself; no hash to choose",
                                        ("sha256",)),
    "prefix_cache_retention_interval": Refused("hyspec's prefix cache keeps pages until the KV pool needs them",
                                               (0,)),
    "prefix_match_unit": Refused("hyspec's prefix cache matches whole pages (--block-size)"),
    "num_gpu_blocks_override": Refused("size the KV cache with --kv-cache-bytes (or --kv-cache-memory-bytes)"),
    "long_prefill_token_threshold": Refused(SCHEDULER, (0,)),
    "long_prefill_token_threshold_adaptive": Refused(SCHEDULER),
    "max_num_scheduled_tokens": Refused(SCHEDULER),
    "max_num_active_seqs": Refused("hyspec runs up to --max-num-seqs requests at once; no separate active limit"),
    "max_num_queued_reqs": Refused("hyspec serve bounds its queue with --max-queue"),
    "max_num_queued_tokens": Refused("hyspec serve bounds its queue by requests (--max-queue), not tokens"),
    "scheduler_reserve_full_isl": Refused(SCHEDULER, (True,)),
    "prefill_schedule_interval": Refused(SCHEDULER, (1,)),
    "disable_chunked_mm_input": Refused(MULTIMODAL),
    "disable_cascade_attn": Refused("hyspec has no cascade attention to disable"),
    "disable_hybrid_kv_cache_manager": Refused("hyspec has one KV cache manager (paged, one page size)"),
    "kv_sharing_fast_prefill": Refused("hyspec's models share no KV between layers"),
    "max_cudagraph_capture_size": Refused("list the sizes with --cudagraph-capture-sizes"),
    "cpu_distributed_timeout_seconds": Refused(ONE_DEVICE),
    "distributed_timeout_seconds": Refused(ONE_DEVICE),
    "device_ids": Refused("pick the device with CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES and --backend"),
    "pt_load_map_location": Refused("hyspec loads the weights onto its backend's device itself", ("cpu",)),
    "revision": Refused(HUB), "code_revision": Refused(HUB), "tokenizer_revision": Refused(HUB),
    "hf_token": Refused(HUB), "download_dir": Refused(HUB), "ignore_patterns": Refused(HUB, (["original/**/*"],)),
    "safetensors_load_strategy": Refused("hyspec reads safetensors through the safetensors package's own loader"),
    "safetensors_prefetch_num_threads": Refused("hyspec reads safetensors through the safetensors package", (8,)),
    "safetensors_prefetch_block_size": Refused("hyspec reads safetensors through the safetensors package",
                                               (16777216,)),
    "model_loader_extra_config": Refused("hyspec has one loader per format, with no options"),
    "quantization_config": Refused("choose hyspec's weight kernels with --quantization"),
    "allow_deprecated_quantization": Refused("hyspec has no deprecated quantization formats"),
    "compilation_config": Refused(CUDA_KERNELS), "attention_config": Refused(CUDA_KERNELS),
    "kernel_config": Refused(CUDA_KERNELS), "ir_op_priority": Refused(CUDA_KERNELS),
    "attention_backend": Refused(CUDA_KERNELS), "linear_backend": Refused(CUDA_KERNELS, ("auto",)),
    "moe_backend": Refused(MOE, ("auto",)), "sparse_indexer_topk_backend": Refused(CUDA_KERNELS, ("auto",)),
    "enable_flashinfer_autotune": Refused(CUDA_KERNELS), "gdn_prefill_backend": Refused(CUDA_KERNELS),
    "kda_prefill_backend": Refused(CUDA_KERNELS), "kda_decode_backend": Refused(CUDA_KERNELS),
    "jit_monitor_mode": Refused(CUDA_KERNELS, ("warn",)), "jit_monitor_verbose": Refused(CUDA_KERNELS),
    "disable_custom_all_reduce": Refused(ONE_DEVICE), "enable_shm_tensor_arena": Refused(ONE_DEVICE),
    "enable_cumem_allocator": Refused(SLEEP), "enable_sleep_mode": Refused(SLEEP),
    "sleep_mode_offload_cudagraph": Refused(SLEEP), "sleep_preserve_parameter_names": Refused(SLEEP),
    "enable_nccl_comm_suspend": Refused(ONE_DEVICE), "worker_cls": Refused(PLUGINS, ("auto",)),
    "worker_extension_cls": Refused(PLUGINS, ("",)), "scheduler_cls": Refused(PLUGINS),
    "io_processor_plugin": Refused(PLUGINS), "model_impl": Refused("hyspec implements each architecture itself",
                                                                  ("auto",)),
    "pooler_config": Refused(POOLING), "diffusion_config": Refused(POOLING),
    "engram_config": Refused(MOE), "aux_output_config": Refused(MOE),
    "logging_config": Refused(LOGGING), "log_config_file": Refused(LOGGING),
    "enable_log_requests": Refused(LOGGING), "aggregate_engine_logging": Refused(LOGGING),
    "enable_logging_iteration_details": Refused(LOGGING),
    "show_hidden_metrics_for_version": Refused("hyspec's metrics have no hidden versions (/metrics)"),
    "otlp_traces_endpoint": Refused(TRACING), "collect_detailed_traces": Refused(TRACING),
    "profiler_config": Refused(TRACING), "enable_layerwise_nvtx_tracing": Refused(TRACING),
    "per_request_spec_decode_metrics": Refused("hyspec's speculation metrics are per method and per server "
                                               "(/metrics, hyspec_spec_*)", ("none",)),
    "kv_cache_metrics": Refused(TRACING), "kv_cache_metrics_sample": Refused(TRACING, (0.01,)),
    "custom_histogram_buckets": Refused(TRACING), "cudagraph_metrics": Refused(TRACING),
    "enable_mfu_metrics": Refused(TRACING), "enable_mm_processor_stats": Refused(MULTIMODAL),
    "fault_tolerance_config": Refused("hyspec restarts nothing by itself: a failed engine turns /health to 503"),
    "enable_fault_tolerance": Refused("hyspec restarts nothing by itself: a failed engine turns /health to 503"),
    "weight_transfer_config": Refused("hyspec does not update weights in a running engine"),
    "_api_process_count": Refused(SINGLE_PROCESS, (1,)), "_api_process_rank": Refused(SINGLE_PROCESS, (0,)),
    "renderer_num_workers": Refused(SINGLE_PROCESS, (1,)),
    "numa_bind": Refused("bind hyspec with numactl / taskset: it sets no affinity itself"),
    "numa_bind_nodes": Refused("bind hyspec with numactl / taskset: it sets no affinity itself"),
    "numa_bind_cpus": Refused("bind hyspec with numactl / taskset: it sets no affinity itself"),
    **_each(Refused(ONE_DEVICE), "distributed_executor_backend", "master_addr", "master_port", "dcp_comm_backend",
            "dcp_q_replicate", "dcp_kv_cache_interleave_size", "cp_kv_cache_interleave_size", "data_parallel_rank",
            "data_parallel_start_rank", "data_parallel_size_local", "data_parallel_address",
            "data_parallel_rpc_port", "data_parallel_hybrid_lb", "data_parallel_external_lb",
            "data_parallel_multi_port_external_lb", "data_parallel_backend", "enable_hc_sp",
            "enable_expert_parallel", "enable_batch_sharded_sampling", "enable_ep_weight_filter", "all2all_backend",
            "enable_elastic_ep", "elastic_ep_max_dp_size", "enable_dbo", "ubatch_size", "dbo_decode_token_threshold",
            "dp_sync_interval", "dbo_prefill_token_threshold", "disable_nccl_for_dp_synchronization", "eplb_config",
            "enable_eplb", "expert_placement_strategy", "ray_workers_use_nsight"),
    **_each(Refused(OFFLOAD), "offload_backend", "cpu_offload_gb", "cpu_offload_params", "offload_group_size",
            "offload_num_in_group", "offload_prefetch_step", "offload_params"),
    **_each(Refused(KV_TRANSFER), "kv_transfer_config", "kv_events_config", "ec_transfer_config",
            "ec_manager_config", "kv_offloading_size", "kv_offloading_backend", "kv_cache_dtype_skip_layers"),
    **_each(Refused(MULTIMODAL), "allowed_media_domains", "language_model_only", "limit_mm_per_prompt",
            "enable_mm_embeds", "interleave_mm_strings", "media_io_kwargs", "mm_processor_kwargs",
            "mm_processor_cache_gb", "mm_processor_cache_type", "mm_hasher_algorithm",
            "mm_shm_cache_max_object_size_mb", "mm_encoder_only", "mm_encoder_tp_mode", "mm_encoder_attn_backend",
            "mm_encoder_attn_dtype", "mm_encoder_fp8_scale_path", "mm_encoder_fp8_scale_save_path",
            "mm_encoder_fp8_scale_save_margin", "skip_mm_profiling", "video_pruning_rate", "video_pruning_method",
            "mm_tensor_ipc", "mm_processor_device", "mm_ipc_gpu_memory_gb", "mm_device_do_normalize"),
    **_each(Refused(LORA), "enable_lora", "max_loras", "max_lora_rank", "default_mm_loras", "fully_sharded_loras",
            "max_cpu_loras", "lora_dtype", "lora_target_modules", "enable_tower_connector_lora",
            "specialize_active_lora", "enable_mixed_moe_lora_format", "enable_moe_shared_loras",
            "max_lora_cls_labels"),
    **_each(Refused(MAMBA), "mamba_config", "mamba_cache_dtype", "mamba_ssm_cache_dtype", "mamba_block_size",
            "mamba_cache_mode", "enable_mamba_shared_prefix_checkpoint", "replayssm_buffer_len", "use_replayssm",
            "mamba_backend", "mamba_ssu_algorithm", "enable_mamba_cache_stochastic_rounding",
            "mamba_cache_philox_rounds"),
    **_each(Refused(REASONING), "reasoning_parser", "reasoning_parser_plugin"),
}

# ``vllm serve``'s own (front-end) arguments: all of them are server options.
SERVER_ARGS: dict[str, Arg] = {
    "host": Implemented("serve.host", "default 127.0.0.1 here (vLLM: all interfaces)"),
    "port": Implemented("serve.port"),
    "api_key": Implemented("serve.api_key", "one key; also from $VLLM_API_KEY or $HYSPEC_API_KEY"),
    "chat_template": Implemented("serve.chat_template", "a file, or the template text itself"),
    "uvicorn_log_level": Implemented("serve.log_level"),
    "disable_fastapi_docs": Implemented("serve.disable_fastapi_docs", "/docs, /redoc and /openapi.json off "
                                                                       "(always off with an API key)"),
    "return_tokens_as_token_ids": Refused("set it per request (the body's return_tokens_as_token_ids)"),
    "response_role": Refused("hyspec answers with the assistant role", ("assistant",)),
    "api_server_count": Refused(SINGLE_PROCESS, (1,)),
    "headless": Refused(SINGLE_PROCESS), "config": Refused("give hyspec serve its flags on the command line"),
    "uds": Refused("hyspec serve listens on TCP (--host, --port)"),
    "root_path": Refused("hyspec serves at the root: strip a proxy's path prefix in the proxy"),
    "middleware": Refused(PLUGINS),
    "allowed_origins": Refused(CORS), "allowed_methods": Refused(CORS, (["*"],)),
    "allowed_headers": Refused(CORS, (["*"],)), "allow_credentials": Refused(CORS),
    "ssl_keyfile": Refused(TLS), "ssl_certfile": Refused(TLS), "ssl_ca_certs": Refused(TLS),
    "ssl_cert_reqs": Refused(TLS, (0,)), "ssl_ciphers": Refused(TLS), "enable_ssl_refresh": Refused(TLS),
    "lora_modules": Refused(LORA),
    "chat_template_content_format": Refused("hyspec gives the template each message's content as a string "
                                            "(text parts joined)", ("auto", "string")),
    "default_chat_template_kwargs": Refused("pass chat_template_kwargs per request"),
    "trust_request_chat_template": Refused("hyspec never renders a template sent in a request"),
    "trust_request_mm_kwargs": Refused(MULTIMODAL),
    "enable_auto_tool_choice": Refused(TOOLS), "tool_call_parser": Refused(TOOLS),
    "tool_parser_plugin": Refused(TOOLS, ("",)), "tool_server": Refused(TOOLS),
    "tool_strict_level": Refused(TOOLS, ("auto",)), "exclude_tools_when_tool_choice_none": Refused(TOOLS),
    "max_log_len": Refused(LOGGING), "enable_log_outputs": Refused(LOGGING),
    "enable_log_deltas": Refused(LOGGING, (True,)), "log_error_stack": Refused(LOGGING),
    "disable_uvicorn_access_log": Refused("hyspec serve writes no access log (the HTTP counters in /metrics "
                                          "count requests)", (True,)),
    "disable_access_log_for_endpoints": Refused("hyspec serve writes no access log"),
    "enable_request_id_headers": Refused("hyspec puts the request id in the response body's `id` only"),
    "enable_force_include_usage": Refused("ask for usage per request (stream_options.include_usage)"),
    "enable_prompt_tokens_details": Refused("hyspec's usage has no prompt_tokens_details"),
    "enable_server_load_tracking": Refused("the server's load is in /metrics (hyspec_requests_running, ...)"),
    "enable_tokenizer_info_endpoint": Refused("hyspec has /tokenize and /detokenize, not /tokenizer_info"),
    "enable_per_request_metrics": Refused(TRACING),
    "enable_offline_docs": Refused("hyspec's /docs page loads its scripts from FastAPI's default CDN"),
    "enable_scale_out": Refused(SINGLE_PROCESS),
    "sse_keep_alive_interval": Refused("hyspec streams no keep-alive comments", (0,)),
    "h11_max_header_count": Refused("hyspec keeps uvicorn's HTTP limits", (256,)),
    "h11_max_incomplete_event_size": Refused("hyspec keeps uvicorn's HTTP limits", (4194304,)),
    "grpc": Refused(OTHER_APIS), "grpc_port": Refused(OTHER_APIS),
    "anthropic_disabled_thinking_effort": Refused(OTHER_APIS, ("auto",)),
    "cohere_format": Refused(OTHER_APIS, ("cmd4",)), "cohere_is_reasoning_model": Refused(OTHER_APIS, (True,)),
    "enable_flash_late_interaction": Refused(POOLING, (True,)),
    "fingerprint_mode": Refused("hyspec reports no system fingerprint", ("full",)),
    "fingerprint_value": Refused("hyspec reports no system fingerprint"),
    **_each(Refused(ONE_DEVICE), "data_parallel_supervisor_port", "dp_supervisor_probe_failure_threshold",
            "dp_supervisor_probe_interval_s", "dp_supervisor_probe_timeout_s"),
}


@lru_cache(maxsize=1)
def vllm_schemas() -> dict[str, Any]:
    """vLLM's and openai's argument and field lists, as scripts/gen_vllm_schemas.py read them."""
    return json.loads(SCHEMAS.read_text())


def vllm_flag(name: str) -> dict[str, Any] | None:
    """vLLM's parser entry for ``name`` (flags, takes_value, many_values, default), or None."""
    for entry in vllm_schemas()["serve_flags"]:
        if entry["dest"] == name:
            return entry
    return None


def lookup(name: str) -> Arg | None:
    return ENGINE_ARGS.get(name) or SERVER_ARGS.get(name)


def refusal(name: str, value: Any) -> str | None:
    """Why vLLM's argument ``name`` = ``value`` is refused, or None when it passes."""
    arg = lookup(name)
    if isinstance(arg, Refused) and not arg.allows(value):
        return f"{name}={value!r} is not supported: {arg.reason}"
    return None


DTYPE_ALIASES = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def engine_kwargs(kwargs: Mapping[str, Any], hyspec_names: frozenset[str]) -> tuple[dict[str, Any], int | None]:
    """``LLM(**kwargs)``'s keywords as LLMEngine keywords, and the seed to apply (vLLM's ``seed``).

    ``hyspec_names``: LLMEngine's own keywords, passed through.  A vLLM argument hyspec implements is
    renamed (``gpu_memory_utilization`` -> ``memory_fraction``); a refused one, a server-only one, or a
    name neither knows raises ConfigError naming it.
    """
    out: dict[str, Any] = {}
    seed = None
    for name, value in kwargs.items():
        arg = lookup(name)
        if name in hyspec_names and not isinstance(arg, Refused):
            out[name] = value
        elif isinstance(arg, Implemented):
            if arg.serve_only:
                raise ConfigError(name, f"is a server option: give it to `hyspec serve --{name.replace('_', '-')}`")
            if arg.dest == "seed":
                seed = value
            elif arg.dest in out or (arg.dest != name and arg.dest in kwargs):
                raise ConfigError(name, f"and {arg.dest} are the same setting (vLLM's name and hyspec's): give one")
            else:
                out[arg.dest] = value
        elif isinstance(arg, Refused):
            if not arg.allows(value):
                raise ConfigError(name, f"{value!r} is not supported: {arg.reason}")
        elif name in vllm_schemas()["llm_kwargs"]:
            raise ConfigError(name, "is a vLLM LLM() argument missing from hyspec.engine.vllm_args (a bug)")
        else:
            raise ConfigError(name, "unknown argument: neither hyspec's LLMEngine nor vLLM's EngineArgs has it")
    if "dtype" in out:
        out["dtype"] = normalize_dtype(out["dtype"])
    return out, seed


def normalize_dtype(dtype: Any) -> Any:
    """vLLM's dtype spellings (``half``, ``float``) as hyspec's (``float16``, ``float32``)."""
    return DTYPE_ALIASES.get(dtype, dtype) if isinstance(dtype, str) else dtype


def apply_seed(seed: int | None) -> None:
    """vLLM's engine ``seed``: seed the default generators that sample requests without a seed of their own."""
    if seed is None:
        return
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError("seed", f"must be an integer, got {seed!r}")
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy

        numpy.random.seed(seed % 2**32)
    except ImportError:
        pass
