"""Reading and writing MTP modules: DeepSeek's layout inside a target checkpoint, or a separate directory.

DeepSeek layout (DeepSeek-V3/R1 on the Hub, read by vLLM's ``deepseek_mtp``):
the target's ``config.json`` has ``num_nextn_predict_layers = M`` and the MTP
modules are decoder layers ``N .. N+M-1`` past the ``N = num_hidden_layers``
target layers::

    model.layers.{N+i}.enorm.weight                 [H]
    model.layers.{N+i}.hnorm.weight                 [H]
    model.layers.{N+i}.eh_proj.weight               [H, 2H]   (input = cat[enorm(emb), hnorm(h)])
    model.layers.{N+i}.shared_head.norm.weight      [H]
    model.layers.{N+i}.shared_head.head.weight      [V, H]    (copy of lm_head; optional here)
    model.layers.{N+i}.embed_tokens.weight          [V, H]    (copy of the embedding; optional here)
    model.layers.{N+i}.{input_layernorm,post_attention_layernorm}.weight, .self_attn.*, .mlp.*

MiMo layout (XiaomiMiMo MiMo-7B, ``model_type: mimo`` = Qwen2 plus MTP; names as vLLM 0.32's
``models/mimo_mtp.py`` maps them): ``model.mtp_layers.{i}.`` holds ``token_layernorm`` (= enorm),
``hidden_layernorm`` (= hnorm), ``input_proj`` [H, 2H] over ``cat[hidden_layernorm(h), token_layernorm(emb)]``
(the halves in the other order from ``eh_proj``: swapped when read), ``final_layernorm`` (= shared_head.norm)
and a Qwen2 decoder layer's tensors without a wrapper.

hyspec's separate layout is the same tensors with ``N = 0`` in a directory of
their own, whose ``config.json`` describes the block (a Llama-family config
with ``num_hidden_layers = M``) and carries ``"hyspec_drafter": {"method":
"mtp", ...}``.  Loading either checks the drafter against the target (hidden
size, vocabulary) and names the tensor or key at fault.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch

from hyspec.drafters.checkpoint_io import (STORAGE, StoredTensors, read_config_json, save_checkpoint, stored_tensors,
                                           write_json_atomically)
from hyspec.drafters.mtp.model import MTPConfig, MTPDrafter
from hyspec.errors import CheckpointError
from hyspec.model.config import ModelConfig
from hyspec.model.llama import DecoderLayer
from hyspec.model.weights import SafetensorsCheckpoint, check_shape, write_safetensors_atomically
from hyspec.ops import OpTable

log = logging.getLogger(__name__)

HYSPEC_KEY = "hyspec_drafter"


def _read_config(path: Path) -> dict[str, Any]:
    return read_config_json(path, "MTP drafter")


def is_mtp_checkpoint(path: str | Path) -> bool:
    """True for a directory in either MTP layout."""
    try:
        data = _read_config(Path(path))
    except CheckpointError:
        return False
    marker = data.get(HYSPEC_KEY)
    if isinstance(marker, dict):
        return marker.get("method") == "mtp"
    return int(data.get("num_nextn_predict_layers") or 0) > 0


def mtp_layout(path: Path) -> tuple[MTPConfig, int]:
    """``(config, first layer index)`` of the MTP checkpoint in ``path``."""
    data = _read_config(path)
    marker = data.get(HYSPEC_KEY)
    if isinstance(marker, dict):
        if marker.get("method") != "mtp":
            raise CheckpointError(f"{path} holds a {marker.get('method')!r} drafter, not an MTP drafter")
        first = int(marker.get("first_layer", 0))
        count = int(data.get("num_nextn_predict_layers") or data.get("num_hidden_layers") or 0)
    else:
        count = int(data.get("num_nextn_predict_layers") or 0)
        if count <= 0:
            raise CheckpointError(f"{path / 'config.json'} has no MTP modules: num_nextn_predict_layers is "
                                  f"{data.get('num_nextn_predict_layers')!r} (DeepSeek layout) and there is no "
                                  f"{HYSPEC_KEY!r} key (hyspec layout)")
        first = int(data["num_hidden_layers"])
        if data.get("model_type") == "mimo":  # MiMoConfig is Qwen2's plus the MTP count; its blocks are Qwen2 layers
            data = {**data, "model_type": "qwen2"}
    return MTPConfig(block=ModelConfig.from_dict(data), num_modules=count), first


def check_against_target(block: ModelConfig, target: ModelConfig, where: Path) -> None:
    for key in ("hidden_size", "vocab_size"):
        mine, theirs = getattr(block, key), getattr(target, key)
        if mine != theirs:
            raise CheckpointError(f"the MTP drafter in {where} was trained for another target: its {key} is {mine}, "
                                  f"the target's is {theirs}")


def _block_from_hf(ckpt: SafetensorsCheckpoint | StoredTensors, src: str, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """HF decoder-layer tensors under ``src`` -> hyspec DecoderLayer names (q/k/v and gate/up fused)."""
    H, I = cfg.hidden_size, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim

    def get(name: str, shape) -> torch.Tensor:
        return check_shape(src + name, ckpt.get(src + name), shape)

    a, m = "self_attn.", "mlp."
    state = {
        a + "qkv_proj.weight": torch.cat([get(a + "q_proj.weight", (q, H)), get(a + "k_proj.weight", (kv, H)),
                                          get(a + "v_proj.weight", (kv, H))]),
        a + "o_proj.weight": get(a + "o_proj.weight", (H, q)),
        m + "gate_up_proj.weight": torch.cat([get(m + "gate_proj.weight", (I, H)), get(m + "up_proj.weight", (I, H))]),
        m + "down_proj.weight": get(m + "down_proj.weight", (H, I)),
        "input_layernorm.weight": get("input_layernorm.weight", (H,)),
        "post_attention_layernorm.weight": get("post_attention_layernorm.weight", (H,)),
    }
    if cfg.qkv_bias:
        state[a + "qkv_proj.bias"] = torch.cat([get(a + "q_proj.bias", (q,)), get(a + "k_proj.bias", (kv,)),
                                                get(a + "v_proj.bias", (kv,))])
    if cfg.o_bias:
        state[a + "o_proj.bias"] = get(a + "o_proj.bias", (H,))
    if cfg.qk_norm:
        state[a + "q_norm.weight"] = get(a + "q_norm.weight", (cfg.head_dim,))
        state[a + "k_norm.weight"] = get(a + "k_norm.weight", (cfg.head_dim,))
    if cfg.mlp_bias:
        state[m + "gate_up_proj.bias"] = torch.cat([get(m + "gate_proj.bias", (I,)), get(m + "up_proj.bias", (I,))])
        state[m + "down_proj.bias"] = get(m + "down_proj.bias", (H,))
    return state


def _block_to_hf(block: DecoderLayer, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The inverse of :func:`_block_from_hf` (fused tensors split back into HF names)."""
    q, kv, I = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.intermediate_size
    out: dict[str, torch.Tensor] = {}
    for name, t in block.state_dict().items():
        t = t.detach()
        if name.startswith("self_attn.qkv_proj."):
            kind = name.rsplit(".", 1)[1]
            for part, piece in zip(("q_proj", "k_proj", "v_proj"), t.split([q, kv, kv])):
                out[f"self_attn.{part}.{kind}"] = piece
        elif name.startswith("mlp.gate_up_proj."):
            kind = name.rsplit(".", 1)[1]
            for part, piece in zip(("gate_proj", "up_proj"), t.split([I, I])):
                out[f"mlp.{part}.{kind}"] = piece
        else:
            out[name] = t
    return out


MIMO_PREFIX = "model.mtp_layers."


def _mimo_module(ckpt: StoredTensors, i: int, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """MiMo's MTP module ``i`` under hyspec's module names."""
    src, H = f"{MIMO_PREFIX}{i}.", cfg.hidden_size

    def get(name: str, shape) -> torch.Tensor:
        if src + name not in ckpt:
            raise CheckpointError(f"the MiMo MTP checkpoint lacks tensor {src + name!r}")
        return check_shape(src + name, ckpt.get(src + name), shape)

    proj = get("input_proj.weight", (H, 2 * H))
    state = {"enorm.weight": get("token_layernorm.weight", (H,)), "hnorm.weight": get("hidden_layernorm.weight", (H,)),
             # MiMo projects cat[hidden, embedding]; hyspec's eh_proj (DeepSeek's) reads cat[embedding, hidden]
             "eh_proj.weight": torch.cat([proj[:, H:], proj[:, :H]], dim=1),
             "head_norm.weight": get("final_layernorm.weight", (H,))}
    state.update({"block." + name: t for name, t in _block_from_hf(ckpt, src, cfg).items()})
    return state


def load_mtp(
    path: str | Path,
    target: ModelConfig,
    embed_weight: torch.Tensor,  # [V, H] the target's
    lm_head_weight: torch.Tensor,  # [V, H] the target's
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    ops: OpTable | None = None,
    max_positions: int | None = None,
) -> MTPDrafter:
    """An :class:`MTPDrafter` from either layout, checked against the target."""
    path = Path(path)
    config, first = mtp_layout(path)
    check_against_target(config.block, target, path)
    ckpt = StoredTensors(path)  # int8-stored matrices come back dequantized
    H, V = config.block.hidden_size, config.block.vocab_size
    state: dict[str, torch.Tensor] = {}
    mimo = f"{MIMO_PREFIX}0.input_proj.weight" in ckpt
    for i in range(config.num_modules):
        src, dst = f"model.layers.{first + i}.", f"layers.{i}."
        if mimo:
            state.update({dst + name: t for name, t in _mimo_module(ckpt, i, config.block).items()})
            continue
        for name, shape in (("enorm.weight", (H,)), ("hnorm.weight", (H,)), ("eh_proj.weight", (H, 2 * H))):
            state[dst + name] = check_shape(src + name, ckpt.get(src + name), shape)
        state[dst + "head_norm.weight"] = check_shape(src + "shared_head.norm.weight",
                                                      ckpt.get(src + "shared_head.norm.weight"), (H,))
        for copy in ("shared_head.head.weight", "embed_tokens.weight"):  # DeepSeek's copies of shared weights
            if src + copy in ckpt:
                check_shape(src + copy, torch.empty(ckpt.shape(src + copy), device="meta"), (V, H))
        for name, t in _block_from_hf(ckpt, src, config.block).items():
            state[dst + "block." + name] = t
    drafter = MTPDrafter(config, embed_weight, lm_head_weight, ops=ops, max_positions=max_positions)
    missing, unexpected = drafter.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"MTP checkpoint in {path} does not match the module: missing {missing[:4]}, "
                              f"unexpected {unexpected[:4]}")
    return drafter.to(device=device, dtype=dtype).eval().requires_grad_(False)


def mtp_tensors(drafter: MTPDrafter, first_layer: int, with_shared_copies: bool) -> dict[str, torch.Tensor]:
    """The drafter's tensors under DeepSeek names starting at layer ``first_layer``."""
    out: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(drafter.layers):
        p = f"model.layers.{first_layer + i}."
        out[p + "enorm.weight"] = layer.enorm.weight.detach()
        out[p + "hnorm.weight"] = layer.hnorm.weight.detach()
        out[p + "eh_proj.weight"] = layer.eh_proj.weight.detach()
        out[p + "shared_head.norm.weight"] = layer.head_norm.weight.detach()
        for name, t in _block_to_hf(layer.block, drafter.config.block).items():
            out[p + name] = t
        if with_shared_copies:
            # Separate copies per module, as DeepSeek ships them (safetensors refuses shared storage).
            out[p + "shared_head.head.weight"] = drafter.shared["lm_head"].detach().clone()
            out[p + "embed_tokens.weight"] = drafter.shared["embed"].detach().clone()
    return {k: v.cpu().contiguous() for k, v in out.items()}


def save_mtp(drafter: MTPDrafter, out_dir: str | Path, target_config: dict[str, Any] | None = None,
             storage: str = "float32") -> None:
    """hyspec's separate layout: ``config.json`` (written last) + ``model.safetensors``.

    ``storage`` (:data:`~hyspec.drafters.checkpoint_io.STORAGE`): float32, bfloat16, or int8 per row (a
    quarter of the bytes; the loader dequantizes).  What keeps the assets' drafters inside the tree's budget;
    verification keeps the output exact whatever the stored precision.
    """
    if storage not in STORAGE:
        raise CheckpointError(f"MTP storage must be one of {', '.join(STORAGE)}, got {storage!r}")
    block = drafter.config.block
    config = dict(block.raw) if block.raw else {}
    config.update(model_type=block.model_type, hidden_size=block.hidden_size, vocab_size=block.vocab_size,
                  intermediate_size=block.intermediate_size, num_attention_heads=block.num_attention_heads,
                  num_key_value_heads=block.num_key_value_heads, head_dim=block.head_dim,
                  rms_norm_eps=block.rms_norm_eps, num_hidden_layers=drafter.num_modules,
                  num_nextn_predict_layers=drafter.num_modules)
    # the target's per-layer attention types (Gemma, transformers-5 Qwen configs) do not describe the modules,
    # whose blocks attend without a window; kept, they would not match num_hidden_layers and refuse the load
    config.pop("layer_types", None)
    config[HYSPEC_KEY] = {"method": "mtp", "first_layer": 0,
                          "target": {k: (target_config or block.raw or {}).get(k)
                                     for k in ("hidden_size", "vocab_size", "num_hidden_layers")}}
    save_checkpoint(out_dir, stored_tensors(mtp_tensors(drafter, 0, with_shared_copies=False), storage), config)


def save_deepseek_layout(drafter: MTPDrafter, target_dir: str | Path, out_dir: str | Path) -> None:
    """A complete DeepSeek-layout model directory: the target's files plus the MTP modules as extra layers.

    The target's shards are copied unchanged; the MTP tensors go into
    ``model-mtp.safetensors``; ``model.safetensors.index.json`` maps both and
    ``config.json`` (written last) gains ``num_nextn_predict_layers``.
    """
    src, out = Path(target_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = _read_config(src)
    n = int(config["num_hidden_layers"])
    weight_map = _weight_map(src)
    for file in sorted(set(weight_map.values())):
        shutil.copyfile(src / file, out / file)
    for file in src.iterdir():  # tokenizer and generation files
        if file.is_file() and not file.name.endswith(".safetensors") and file.name not in (
                "config.json", "model.safetensors.index.json"):
            shutil.copyfile(file, out / file.name)
    tensors = mtp_tensors(drafter, n, with_shared_copies=True)
    write_safetensors_atomically(tensors, out / "model-mtp.safetensors", metadata={"format": "pt"})
    weight_map.update({name: "model-mtp.safetensors" for name in tensors})
    write_json_atomically(out / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})
    config["num_nextn_predict_layers"] = drafter.num_modules
    write_json_atomically(out / "config.json", config)


def _weight_map(path: Path) -> dict[str, str]:
    """Tensor name -> shard file name of the checkpoint in ``path``."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    SafetensorsCheckpoint(path)  # validates every file (clear errors for corrupt ones)
    from safetensors import safe_open

    out: dict[str, str] = {}
    for file in sorted(path.glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            out.update({name: file.name for name in f.keys()})
    return out

