"""hyspec's trained drafters written as vLLM loads them: ``speculative_config={"method": "eagle3" | "draft_model",
"model": DIR}``.

hyspec stores its drafters small (int8 matrices with per-row scales, ``hyspec_storage`` in config.json), a
layout only hyspec reads.  vLLM 0.32 loads

* an EAGLE-3 head (``vllm/model_executor/models/llama_eagle3.py``, ``Eagle3LlamaForCausalLM``): dense
  ``fc.weight``, ``midlayer.*`` (mapped to its ``layers.0.*``), ``norm.weight``, ``lm_head.weight``
  [draft_vocab_size, H] and ``d2t`` (target id = draft id + d2t; ``t2d`` is skipped by vLLM, kept for
  SGLang and SafeAILab); config keys ``draft_vocab_size``, ``target_hidden_size``,
  ``eagle_aux_hidden_state_layer_ids`` (vLLM's numbering: id j is the input of target layer j, hyspec's
  numbering too), ``eagle_config.use_aux_hidden_state`` and ``norm_before_residual``.  Without
  ``embed_tokens`` in the file, vLLM shares the target's embedding, as hyspec does.
* a draft model (``method: "draft_model"``): a plain Hugging Face ``LlamaForCausalLM`` directory whose
  vocabulary is the target's (vLLM tokenizes with the target's tokenizer); the target's tokenizer files are
  copied in so the directory also stands alone (transformers' assisted generation).

Each export is checked against the target it is for (the directory vLLM will serve, or a GGUF): a drafter
trained for another target is refused naming both targets' vocabulary and hidden size, and the target
written into the exported config (``hyspec_target``) lets :func:`check_exported_drafter` refuse the export
later when it is paired with a different target (vLLM itself would load it, or fail on a shape).

The directory is written beside ``out`` under a temporary name and renamed when complete, so an interrupted
export leaves nothing half-written; an existing non-empty directory is never overwritten.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hyspec.drafters.checkpoint_io import CONFIG_FILE, TENSORS_FILE, StoredTensors, read_config_json
from hyspec.drafters.eagle.checkpoint import eagle_config_dict, read_public_tensors
from hyspec.drafters.eagle.model import EAGLE3
from hyspec.errors import CheckpointError, HyspecError
from hyspec.model.config import ModelConfig
from hyspec.model.gguf_checkpoint import is_gguf
from hyspec.model.staging import publish_staged_directory
from hyspec.model.weights import write_safetensors_atomically

DRAFT_MODEL = "draft_model"
#: hyspec method -> vLLM 0.32's ``speculative_config["method"]`` for it (the same names)
VLLM_METHODS = {EAGLE3: "eagle3", DRAFT_MODEL: "draft_model"}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TARGET_KEY = "hyspec_target"  # in the exported config.json: the target the export was checked against
TRAINING_LOG = "training_log.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class TargetFacts:
    """What a drafter must agree with: the target's name and shape."""

    name: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int

    @classmethod
    def of(cls, target: str | Path) -> "TargetFacts":
        """From a Hugging Face model directory's config.json or a GGUF's metadata."""
        path = Path(target)
        cfg = ModelConfig.from_pretrained(path)
        return cls(path.name, cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers)

    def describe(self) -> str:
        return (f"{self.name!r} (vocab_size {self.vocab_size}, hidden size {self.hidden_size}, "
                f"{self.num_hidden_layers} layers)")


def trained_for(drafter: Path, config: dict[str, Any]) -> TargetFacts | None:
    """The target a hyspec drafter was trained for (its training log), or exported for (``hyspec_target``)."""
    if isinstance(config.get(TARGET_KEY), dict):
        try:
            return TargetFacts(**config[TARGET_KEY])
        except TypeError:
            raise CheckpointError(f"{drafter / CONFIG_FILE}: {TARGET_KEY} is malformed: {config[TARGET_KEY]!r}") from None
    log_file = drafter / TRAINING_LOG
    if not log_file.is_file():
        return None
    try:
        log = json.loads(log_file.read_text())
        shape = log["target_model"]
        return TargetFacts(Path(str(log.get("target", "unknown"))).name, int(shape["vocab_size"]),
                           int(shape["hidden_size"]), int(shape["num_hidden_layers"]))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        return None  # an older or hand-written log: the config's own shape is checked instead


def _refuse_other_target(method: str, drafter: Path, source: TargetFacts | None, target: TargetFacts,
                         vocab_size: int, target_hidden_size: int | None) -> None:
    """Refuse, naming both targets, a drafter whose vocabulary (and for EAGLE-3 hidden size / depth) is not
    the target's.  A draft model is a language model of its own: only its vocabulary must match."""
    hidden = target_hidden_size if method == EAGLE3 else None
    layers = None
    if source is not None:
        vocab_size = source.vocab_size
        if method == EAGLE3:
            hidden, layers = source.hidden_size, source.num_hidden_layers
    bad = (vocab_size != target.vocab_size or (hidden is not None and hidden != target.hidden_size)
           or (layers is not None and layers != target.num_hidden_layers))
    if not bad:
        return
    if source is not None:
        was = f"target {source.describe()}"
    else:
        was = f"a target with vocab_size {vocab_size}" + (f" and hidden size {hidden}" if hidden else "")
    raise HyspecError(f"the {method} drafter in {drafter} was trained for {was}; the target {target.describe()} "
                      f"is another model: export a drafter trained for it (hyspec train-draft --method {method})")


def export_drafter(method: str, drafter: str | Path, target: str | Path, out: str | Path,
                   dtype: str = "float32", head_dim: int | None = None) -> Path:
    """Write hyspec drafter ``drafter`` (method ``eagle3`` or ``draft_model``) to the new directory ``out`` in
    vLLM's layout for ``target`` (the model directory vLLM serves, or its GGUF); return ``out``.

    ``head_dim`` (draft_model only) writes the attention heads that wide, zero-padded, the same function
    (:func:`pad_attention_heads`): vLLM's CPU attention runs only some head sizes (32, 64, 80, ... in 0.32),
    and the committed draft model's heads are 40 wide."""
    if method not in VLLM_METHODS:
        raise HyspecError(f"method {method!r}: export-drafter writes {' and '.join(VLLM_METHODS)} drafters "
                          "(the methods whose hyspec drafters vLLM loads)")
    if dtype not in DTYPES:
        raise HyspecError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    if head_dim is not None and method != DRAFT_MODEL:
        raise HyspecError(f"head_dim: padding the attention heads applies to draft_model exports, not {method}")
    src, dst = Path(drafter), Path(out)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise HyspecError(f"{dst} exists and is not an empty directory: choose a new one (nothing was written)")
    facts = TargetFacts.of(target)
    target_cfg = ModelConfig.from_pretrained(target)
    raw = read_config_json(src, f"{method} drafter")
    source = trained_for(src, raw)
    if method == EAGLE3:
        _refuse_other_target(method, src, source, facts, int(raw.get("vocab_size") or 0),
                             int(raw.get("target_hidden_size") or raw.get("hidden_size") or 0))
        tensors, config = _eagle3(src, target_cfg, DTYPES[dtype])
    else:
        _refuse_other_target(method, src, source, facts, int(raw.get("vocab_size") or 0), None)
        tensors, config = _draft_model(src, raw, target_cfg, DTYPES[dtype])
        if head_dim is not None:
            tensors, config = pad_attention_heads(tensors, config, head_dim)
    config["torch_dtype"] = dtype
    config[TARGET_KEY] = asdict(facts)
    _write(dst, tensors, config, Path(target) if method == DRAFT_MODEL else None, src)
    return dst


def _eagle3(src: Path, target_cfg: ModelConfig, dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    cfg, public = read_public_tensors(src, EAGLE3, target_cfg)
    tensors = {n: (t.to(dtype) if t.is_floating_point() else t).contiguous() for n, t in public.items()}
    tensors["d2t"] = tensors["d2t"].to(torch.int64)
    if "t2d" in tensors:
        tensors["t2d"] = tensors["t2d"].to(torch.bool)
    return tensors, eagle_config_dict(cfg, dtype, "fc.bias" in tensors)


def _draft_model(src: Path, raw: dict[str, Any], target_cfg: ModelConfig,
                 dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if raw.get("model_type") != "llama" or "LlamaForCausalLM" not in (raw.get("architectures") or []):
        raise CheckpointError(f"{src / CONFIG_FILE}: a draft model exports as LlamaForCausalLM; this one is "
                              f"{raw.get('architectures')} ({raw.get('model_type')})")
    stored = StoredTensors(src)  # int8 storage, if any, comes back dense
    tensors = {n: stored.get(n).to(dtype).contiguous() for n in stored.names()}
    embed = tensors.get("model.embed_tokens.weight")
    if embed is None or embed.shape[0] != target_cfg.vocab_size:
        raise CheckpointError(f"{src}: model.embed_tokens.weight is {None if embed is None else tuple(embed.shape)}; "
                              f"the target's vocabulary has {target_cfg.vocab_size} tokens")
    config = {k: v for k, v in raw.items() if not k.startswith("hyspec_")}
    return tensors, config


def pad_attention_heads(tensors: dict[str, torch.Tensor], config: dict[str, Any],
                        head_dim: int) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The same Llama with every attention head ``head_dim`` wide instead of ``d``: each head's q/k/v rows
    zero-padded from d to ``head_dim`` (o_proj's columns likewise), q scaled by sqrt(head_dim / d) so that
    q.k / sqrt(head_dim) is the original q.k / sqrt(d), and RoPE kept on the first d dimensions of each head
    (``rope_parameters.partial_rotary_factor`` = d / head_dim: vLLM's get_rope rotates ``x[..., :rotary_dim]``
    in pairs (i, i + rotary_dim / 2), which are the original pairs).  The padded dimensions of q, k and v are
    zero, so they add nothing to q.k and nothing to the output.  Only engines that apply a partial rotary
    factor run it the same (vLLM does; transformers' Llama and hyspec do not): it is a vLLM-only layout."""
    heads, kv_heads = int(config["num_attention_heads"]), int(config.get("num_key_value_heads") or config["num_attention_heads"])
    d = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    rope = dict(config.get("rope_parameters") or {})
    if rope.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) not in (1, 1.0):
        raise HyspecError("head_dim: the draft model already rotates part of each head; padding it is not supported")
    if head_dim <= d or head_dim % 2:
        raise HyspecError(f"head_dim {head_dim}: must be even and wider than the draft model's heads ({d})")
    scale = (head_dim / d) ** 0.5
    out = dict(tensors)
    for name, t in tensors.items():
        proj = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
        if ".self_attn." not in name or proj not in ("q_proj", "k_proj", "v_proj", "o_proj"):
            continue
        if proj == "o_proj":
            if name.endswith(".weight"):  # columns are the heads' outputs
                rows = t.shape[0]
                padded = t.new_zeros(rows, heads, head_dim)
                padded[:, :, :d] = t.view(rows, heads, d)
                out[name] = padded.view(rows, heads * head_dim)
            continue
        n = heads if proj == "q_proj" else kv_heads
        rest = t.shape[1:]  # (hidden,) for a weight, () for a bias
        padded = t.new_zeros(n, head_dim, *rest)
        padded[:, :d] = t.view(n, d, *rest) * (scale if proj == "q_proj" else 1.0)
        out[name] = padded.view(n * head_dim, *rest)
    theta = rope.get("rope_theta", config.get("rope_theta"))
    rope.setdefault("rope_type", "default")
    if theta is not None:
        rope["rope_theta"] = theta
    rope["partial_rotary_factor"] = d / head_dim
    return out, {**config, "head_dim": head_dim, "rope_parameters": rope}


def _write(dst: Path, tensors: dict[str, torch.Tensor], config: dict[str, Any], tokenizer_from: Path | None,
           src: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        write_safetensors_atomically(tensors, staging / TENSORS_FILE, metadata={"format": "pt"})
        if tokenizer_from is not None:
            _copy_target_tokenizer(tokenizer_from, src, staging)
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        publish_staged_directory(staging, dst)  # dst: absent or empty, checked by the caller
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _copy_target_tokenizer(target: Path, drafter: Path, out: Path) -> None:
    """The target's tokenizer into the draft model's directory, after checking the drafter's own (if it has
    one) has the same vocabulary: a draft model's token ids are the target's."""
    from hyspec.model.tokenizer import Tokenizer

    target_tok = Tokenizer(target)
    if (drafter / "tokenizer.json").is_file() and Tokenizer(drafter).get_vocab() != target_tok.get_vocab():
        raise HyspecError(f"the draft model in {drafter} has a tokenizer whose vocabulary differs from the target "
                          f"{target.name!r}'s ({target_tok.vocab_size} tokens): its token ids mean other tokens")
    if is_gguf(target):
        target_tok.save(out)
        return
    for name in _TOKENIZER_FILES:
        if (target / name).is_file():
            shutil.copyfile(target / name, out / name)


def check_exported_drafter(drafter: str | Path, target: str | Path) -> dict[str, Any]:
    """Refuse an exported drafter paired with a target other than the one it was exported for (naming both);
    return its config.  vLLM would load an EAGLE-3 head onto any target of the same shapes, and a draft model
    onto any target of the same vocabulary size."""
    path = Path(drafter)
    config = read_config_json(path, "exported drafter")
    facts = TargetFacts.of(target)
    if not isinstance(config.get(TARGET_KEY), dict):
        raise HyspecError(f"{path / CONFIG_FILE} has no {TARGET_KEY}: it was not written by hyspec export-drafter "
                          "(export it with: hyspec export-drafter METHOD OUT --target TARGET)")
    was = trained_for(path, config)
    assert was is not None
    if "LlamaForCausalLMEagle3" in (config.get("architectures") or []):
        method, same = EAGLE3, (was.vocab_size, was.hidden_size, was.num_hidden_layers) == (
            facts.vocab_size, facts.hidden_size, facts.num_hidden_layers)
    else:
        method, same = DRAFT_MODEL, was.vocab_size == facts.vocab_size
    if not same:
        raise HyspecError(f"the {method} drafter in {path} was exported for target {was.describe()}; the target "
                          f"{facts.describe()} is another model: export the drafter for it")
    return config


__all__ = ["DTYPES", "TARGET_KEY", "VLLM_METHODS", "TargetFacts", "check_exported_drafter", "export_drafter",
           "pad_attention_heads", "trained_for"]
