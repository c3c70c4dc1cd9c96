"""Reading llama.cpp's GGUF files: config, tensors under Hugging Face names, quantized blocks.

Parsing and dequantization are the ``gguf`` package's (llama.cpp's own Python
library); this module only maps its contents onto what the rest of hyspec
reads from a Hugging Face directory:

* the metadata (``llama.block_count``, ...) becomes a ``config.json``-shaped
  dict for :class:`hyspec.model.config.ModelConfig`;
* tensors get their Hugging Face names (``blk.3.attn_q.weight`` ->
  ``model.layers.3.self_attn.q_proj.weight``), so the safetensors loader's
  name mapping, fusing and shape checks serve both formats;
* llama.cpp's converter reorders the rows of Llama's q/k projections for its
  interleaved RoPE; :func:`unpermute_rope_rows` undoes it, so the model code
  keeps the Hugging Face (rotate-half) layout.  Qwen2/Qwen3 use NeoX RoPE and
  are stored unpermuted.

Quantized tensors stay available as their raw GGUF blocks
(:meth:`GGUFCheckpoint.quantized`) for a backend that computes with them;
:meth:`GGUFCheckpoint.get` dequantizes to fp32.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hyspec.errors import CheckpointError
from hyspec.model.gguf_moe import is_moe_gguf, moe_hf_config, moe_tensors
from hyspec.model.quant import from_gguf, permute_rows, stored_blocks

#: GGUF ``general.architecture`` values hyspec runs, and the Hugging Face model_type each becomes (a ``llama``
#: file with ``llama.expert_count`` is a Mixtral, hyspec.model.gguf_moe)
SUPPORTED_GGUF_ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
                                "gemma2": "gemma2", "gemma3": "gemma3_text", "qwen2moe": "qwen2_moe",
                                "qwen3moe": "qwen3_moe"}
#: architectures whose RMSNorm multiplies by ``1 + w``: llama.cpp's converter stores ``w + 1`` (convert_hf_to_gguf.py
#: Gemma2Model / Gemma3Model.modify_tensors, ggml-org/llama.cpp a458664), which :meth:`GGUFCheckpoint.get` undoes
#: so that every reader sees Hugging Face's values
_NORM_SHIFTED = ("gemma2", "gemma3")

#: GGUF tensor name (per layer: after ``blk.N.``) -> Hugging Face name (after ``model.layers.N.``).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: per architecture, the GGUF layer names that mean something else there (gguf-py's tensor_mapping.py)
_ARCH_LAYER_NAMES = {
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},  # stored fused, as Phi-3 does
    "gemma2": {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
}
_ARCH_LAYER_NAMES["gemma3"] = _ARCH_LAYER_NAMES["gemma2"]
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.([a-z_0-9]+)\.(weight|bias)$")


def is_gguf(path: str | Path) -> bool:
    """A path names a GGUF file (by its suffix; the magic number is checked on opening)."""
    return str(path).lower().endswith(".gguf")


@dataclass(frozen=True)
class QuantizedTensor:
    """One tensor as the file stores it: raw blocks of ``qtype`` for a ``shape`` (rows, cols) matrix."""

    name: str
    qtype: str  # GGML type name: Q4_0, Q4_1, Q8_0, F16, ...
    shape: tuple[int, ...]  # Hugging Face order (rows first), not GGUF's ne order
    data: np.ndarray  # uint8 blocks [rows, bytes per row] for quantized types, else the values


class GGUFCheckpoint:
    """A GGUF file behind the same interface as :class:`~hyspec.model.weights.SafetensorsCheckpoint`."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.reader, self.metadata = _open(self.path)
        arch = self.metadata.get("general.architecture")
        if arch not in SUPPORTED_GGUF_ARCHITECTURES:
            raise CheckpointError(
                f"{self.path.name}: GGUF architecture {arch!r} is not supported; supported: "
                f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
        self.architecture: str = arch
        self._tensors: dict[str, Any] = {}
        for t in self.reader.tensors:
            hf = hf_tensor_name(t.name, arch)
            if hf is not None:
                self._tensors[hf] = t
        self._longrope_tensors()  # a half-written longrope file is refused on opening
        experts = self.metadata.get(f"{arch}.expert_count") or 0
        self.is_moe = is_moe_gguf(arch, self.metadata)
        if self.is_moe:  # Mixtral ("llama" with expert_count), Qwen2-MoE, Qwen3-MoE: stacked ffn_*_exps tensors
            self._tensors.update(moe_tensors(self.reader.tensors, arch, int(experts), self.path.name))
        elif experts:
            raise CheckpointError(f"{self.path.name}: a mixture-of-experts GGUF of architecture {arch!r} "
                                  f"({arch}.expert_count {experts}) is not supported; the MoE architectures hyspec "
                                  "reads from GGUF are llama (Mixtral), qwen2moe and qwen3moe")
        elif arch in ("qwen2moe", "qwen3moe"):
            raise CheckpointError(f"{self.path.name}: GGUF metadata lacks {arch}.expert_count")
        # Heads per projection, for undoing llama.cpp's q/k row order (read once, not per tensor).
        heads = self.metadata.get(f"{arch}.attention.head_count")
        self._heads = {"q_proj": heads, "k_proj": self.metadata.get(f"{arch}.attention.head_count_kv", heads)}

    # -- config ------------------------------------------------------------------------------------

    def hf_config(self) -> dict[str, Any]:
        """The model's ``config.json`` as Hugging Face would write it, from the GGUF metadata."""
        md, arch = self.metadata, self.architecture

        def key(name: str, default: Any = None, required: bool = True) -> Any:
            value = md.get(f"{arch}.{name}", default)
            if value is None and required:
                raise CheckpointError(f"{self.path.name}: GGUF metadata lacks {arch}.{name}")
            return value

        heads = int(key("attention.head_count"))
        hidden = int(key("embedding_length"))
        vocab = md.get(f"{arch}.vocab_size")
        if vocab is None:  # older files: the vocabulary's length, or the embedding's rows
            tokens = md.get("tokenizer.ggml.tokens")
            vocab = len(tokens) if tokens is not None else int(self._tensor("token_embd.weight").shape[1])
        cfg: dict[str, Any] = {
            "model_type": SUPPORTED_GGUF_ARCHITECTURES[arch],
            "architectures": [f"GGUF:{arch}"],
            "vocab_size": int(vocab),
            "hidden_size": hidden,
            "intermediate_size": int(key("feed_forward_length")),
            "num_hidden_layers": int(key("block_count")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(key("attention.head_count_kv", heads)),
            "head_dim": int(key("attention.key_length", None, required=False) or hidden // heads),
            "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
            "max_position_embeddings": int(key("context_length")),
            "rope_theta": float(key("rope.freq_base", 10000.0)),
            # A file without output.weight reuses the embedding (llama.cpp's rule for tied models).
            "tie_word_embeddings": not any(t.name == "output.weight" for t in self.reader.tensors),
            "hidden_act": "silu" if arch not in _NORM_SHIFTED else "gelu_pytorch_tanh",
            "torch_dtype": self._natural_dtype(),
            "bos_token_id": md.get("tokenizer.ggml.bos_token_id"),
            "eos_token_id": md.get("tokenizer.ggml.eos_token_id"),
        }
        self._sliding_window(cfg)
        if self.is_moe:
            routed = {int(t.name.split(".")[1]) for t in self.reader.tensors
                      if t.name.startswith("blk.") and t.name.endswith(".ffn_gate_inp.weight")}
            moe_hf_config(cfg, md, arch, routed, "model.layers.0.self_attn.q_proj.bias" in self._tensors,
                          self.path.name)
        if arch in _NORM_SHIFTED:
            self._gemma(cfg)
        freqs = self._optional_tensor("rope_freqs.weight")
        if freqs is not None:
            # llama.cpp's converter writes llama3 RoPE scaling (Llama 3.1 / 3.2 / 3.3) as this tensor, not as
            # metadata (convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors): per-frequency divisors
            cfg["rope_freq_factors"] = [float(f) for f in np.asarray(freqs.data, dtype=np.float32).reshape(-1)]
        scaling = md.get(f"{arch}.rope.scaling.type")
        if self._longrope(cfg, scaling):
            return cfg
        if scaling not in (None, "none"):
            factor = md.get(f"{arch}.rope.scaling.factor")
            if scaling not in ("linear", "yarn") or factor is None:
                raise CheckpointError(f"{self.path.name}: GGUF RoPE scaling {scaling!r} is not supported "
                                      "(supported: linear and yarn with a factor)")
            cfg["rope_scaling"] = {"rope_type": scaling, "factor": float(factor),
                                   "original_max_position_embeddings":
                                       md.get(f"{arch}.rope.scaling.original_context_length")}
        return cfg

    def _longrope(self, cfg: dict[str, Any], scaling_type: Any) -> bool:
        """Phi-3's longrope as llama.cpp's converter writes it (convert_hf_to_gguf.py ``Phi3MiniModel``,
        ggml-org/llama.cpp a458664): the two factor sets as the tensors ``rope_factors_long`` /
        ``rope_factors_short``, ``{arch}.rope.scaling.attn_factor``, ``{arch}.context_length`` (the config's
        max_position_embeddings) and ``{arch}.rope.scaling.original_context_length``.  True: read."""
        md, arch, name = self.metadata, self.architecture, self.path.name
        tensors = self._longrope_tensors()
        if not tensors:
            return False
        if scaling_type not in (None, "none") or "rope_freq_factors" in cfg:
            other = "rope_freqs" if "rope_freq_factors" in cfg else f"RoPE scaling type {scaling_type!r}"
            raise CheckpointError(f"{name}: GGUF has longrope factors and {other}; hyspec does not combine them")
        orig = md.get(f"{arch}.rope.scaling.original_context_length")
        if orig is None:
            raise CheckpointError(f"{name}: GGUF metadata lacks {arch}.rope.scaling.original_context_length, "
                                  "which picks longrope's factor set")
        factors = {f"{kind}_factor": [float(f) for f in np.asarray(t.data, dtype=np.float32).reshape(-1)]
                   for kind, t in tensors.items()}
        cfg["original_max_position_embeddings"] = int(orig)
        cfg["rope_scaling"] = {"rope_type": "longrope", "original_max_position_embeddings": int(orig), **factors}
        attn = md.get(f"{arch}.rope.scaling.attn_factor")
        if attn is not None:
            cfg["rope_scaling"]["attention_factor"] = float(attn)
        return True

    def _longrope_tensors(self) -> dict[str, Any]:
        """``{"long": tensor, "short": tensor}`` where the file holds longrope's factor sets, else {}; one set
        alone, or the sets in another architecture than phi3, is refused by name."""
        name = self.path.name
        tensors = {kind: self._optional_tensor(f"rope_factors_{kind}.weight") for kind in ("long", "short")}
        present = sorted(kind for kind, t in tensors.items() if t is not None)
        if not present:
            return {}
        if self.architecture != "phi3":
            raise CheckpointError(f"{name}: rope_factors_{present[0]} (longrope) in a GGUF of architecture "
                                  f"{self.architecture!r} is not supported; hyspec reads longrope GGUFs of "
                                  "architecture phi3")
        if len(present) == 1:
            missing = "short" if present == ["long"] else "long"
            raise CheckpointError(f"{name}: GGUF has rope_factors_{present[0]} but not rope_factors_{missing}; "
                                  "longrope needs both factor sets")
        return tensors

    def _sliding_window(self, cfg: dict[str, Any]) -> None:
        """``{arch}.attention.sliding_window`` (and ``.sliding_window_pattern``: per layer, True = windowed) into
        the config keys transformers reads: a windowed llama file is a Mistral, a Qwen gets ``layer_types``."""
        md, arch = self.metadata, self.architecture
        window = md.get(f"{arch}.attention.sliding_window")
        if not window:
            return
        layers = cfg["num_hidden_layers"]
        pattern = md.get(f"{arch}.attention.sliding_window_pattern")
        if pattern is None:
            windowed = [True] * layers
        elif isinstance(pattern, (list, tuple)) and len(pattern) == layers:
            windowed = [bool(p) for p in pattern]
        else:
            raise CheckpointError(f"{self.path.name}: GGUF {arch}.attention.sliding_window_pattern {pattern!r} is not "
                                  f"supported (only one boolean per layer, {layers} layers)")
        cfg["sliding_window"] = int(window)
        if arch == "llama":
            if not all(windowed):
                raise CheckpointError(f"{self.path.name}: a llama GGUF with a window on some layers only is not supported")
            cfg["model_type"] = "mistral"  # transformers' Llama has no window; Mistral is Llama with one
        else:
            cfg["use_sliding_window"] = True
            cfg["layer_types"] = ["sliding_attention" if w else "full_attention" for w in windowed]

    def _gemma(self, cfg: dict[str, Any]) -> None:
        """Gemma's keys as llama.cpp reads them (src/llama-model.cpp, ggml-org/llama.cpp a458664): soft-caps from
        metadata; the attention scale, which the converter does not store, by llama.cpp's rule (``n_embd / n_head``
        for the 27B sizes, 46 layers for Gemma 2 and 62 for Gemma 3, else head_dim); the sliding pattern llama.cpp
        fixes (every other layer for Gemma 2, five of six for Gemma 3, left to the config's defaults) unless the
        file lists it; Gemma 3's local RoPE base 10000 (the config's default)."""
        md, arch = self.metadata, self.architecture
        hidden, heads, layers = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
        for key in ("attn_logit_softcapping", "final_logit_softcapping"):
            cfg[key] = md.get(f"{arch}.{key}")
        if arch == "gemma3":
            cfg["attn_logit_softcapping"] = None
        is_27b = layers == (46 if arch == "gemma2" else 62)
        cfg["query_pre_attn_scalar"] = hidden // heads if is_27b else cfg["head_dim"]
        cfg.pop("use_sliding_window", None)
        if md.get(f"{arch}.attention.sliding_window_pattern") is None:
            cfg.pop("layer_types", None)

    def _natural_dtype(self) -> str:
        """bf16 unless every matrix is fp32: quantized or 16-bit weights lose nothing that matters in bf16
        compute, and it halves the bytes a CPU decode step reads.  Ask for float32 to get the file's values."""
        types = {t.tensor_type.name for t in self.reader.tensors if len(t.shape) > 1}
        return "float32" if types <= {"F32"} else "bfloat16"

    # -- tensors -----------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self._get(name).shape))

    def get(self, name: str) -> torch.Tensor:
        """The tensor in fp32 under its Hugging Face name and layout (q/k rows in rotate-half order)."""
        t = self._get(name)
        from gguf import quants

        try:
            values = quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise CheckpointError(f"{self.path.name}: tensor {t.name} is stored as {t.tensor_type.name}, which "
                                  "the installed gguf package cannot dequantize") from None
        except (ValueError, IndexError) as exc:
            raise CheckpointError(f"{self.path.name}: tensor {t.name} is corrupt: {exc}") from None
        values = np.ascontiguousarray(values, dtype=np.float32).reshape(self.shape(name))
        if not values.flags.writeable:  # F32 tensors come straight from the read-only memory map
            values = values.copy()
        tensor = torch.from_numpy(values)
        if self.architecture in _NORM_SHIFTED and name.endswith("norm.weight"):
            tensor = tensor - 1.0
        proj = name.split(".")[-2]
        if self.architecture == "llama" and proj in self._heads:
            if self._heads[proj] is None:
                raise CheckpointError(f"{self.path.name}: GGUF metadata lacks llama.attention.head_count")
            tensor = unpermute_rope_rows(tensor, self._heads[proj])
        return tensor

    def quantized(self, name: str) -> QuantizedTensor:
        """The raw stored blocks of a tensor (rows in the file's order, q/k still interleaved for RoPE)."""
        t = self._get(name)
        return QuantizedTensor(name, t.tensor_type.name, self.shape(name), t.data)

    def group_quantized(self, name: str):
        """The tensor as codes + scales + zeros in Hugging Face row order (q/k rows un-interleaved, exactly:
        a row permutation); Q5_0 / Q5_1 / K-quants as their blocks only (hyspec.model.quant.stored_blocks);
        None for other types (F32, F16, Q2_K, IQ*, ...)."""
        t = self._get(name)
        w = from_gguf(t.tensor_type.name, t.data, self.shape(name), name)
        if w is None:
            w = stored_blocks(t.tensor_type.name, t.data, self.shape(name), name)
        proj = name.split(".")[-2]
        if w is not None and self.architecture == "llama" and proj in self._heads:
            if self._heads[proj] is None:
                raise CheckpointError(f"{self.path.name}: GGUF metadata lacks llama.attention.head_count")
            w = permute_rows(w, unpermute_rope_rows(torch.arange(w.shape[0]), self._heads[proj]))
        return w

    def tensor_type(self, name: str) -> str:
        """The GGML type a tensor is stored in (Q4_1, Q8_0, F32, ...)."""
        return self._get(name).tensor_type.name

    def tensor_types(self) -> dict[str, int]:
        """How many tensors the file stores in each GGML type."""
        counts: dict[str, int] = {}
        for t in self.reader.tensors:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts

    def _get(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise CheckpointError(f"tensor {name!r} is missing from {self.path.name}") from None

    def _optional_tensor(self, gguf_name: str):
        return next((t for t in self.reader.tensors if t.name == gguf_name), None)

    def _tensor(self, gguf_name: str):
        for t in self.reader.tensors:
            if t.name == gguf_name:
                return t
        raise CheckpointError(f"{self.path.name}: GGUF tensor {gguf_name!r} is missing")


def hf_tensor_name(gguf_name: str, arch: str = "llama") -> str | None:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight`` (in the GGUF architecture ``arch``);
    None for tensors that are not weights of a module (``rope_freqs``: read into the config by
    :meth:`GGUFCheckpoint.hf_config`)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    names = {**_LAYER_NAMES, **_ARCH_LAYER_NAMES.get(arch, {})}
    if m is None or m.group(2) not in names:
        return None
    return f"model.layers.{m.group(1)}.{names[m.group(2)]}.{m.group(3)}"


def unpermute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row order: per head it interleaves the two rotate-half halves
    (rows 0, D/2, 1, D/2+1, ...); Hugging Face keeps them as two blocks.  Works for weights and biases."""
    rows = w.shape[0]
    if rows % (2 * num_heads):
        raise CheckpointError(f"q/k projection with {rows} rows cannot be split into {num_heads} RoPE heads")
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def permute_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's converter order (the inverse of :func:`unpermute_rope_rows`); used to write test files."""
    rows = w.shape[0]
    return w.reshape(num_heads, 2, rows // num_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


@lru_cache(maxsize=4)
def _cached_open(path: str, size: int, mtime_ns: int):
    from gguf import GGUFReader

    reader = GGUFReader(path)
    return reader, _metadata(reader, Path(path))


def _open(path: Path):
    """One parsed reader per file (config, tokenizer and weights read it in turn: parsing takes seconds)."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise CheckpointError("reading GGUF files needs the gguf package: pip install gguf") from None
    if not path.is_file():
        raise CheckpointError(f"GGUF file {str(path)!r} does not exist")
    st = path.stat()
    try:
        return _cached_open(str(path.resolve()), st.st_size, st.st_mtime_ns)
    except CheckpointError:
        raise
    except Exception as exc:  # numpy and struct errors from a truncated or foreign file
        raise CheckpointError(f"{path.name} is not a readable GGUF file (truncated or corrupt?): "
                              f"{type(exc).__name__}: {exc}") from None


def _metadata(reader, path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        try:
            out[name] = field.contents()
        except Exception as exc:
            raise CheckpointError(f"{path.name}: GGUF metadata field {name!r} cannot be read: {exc}") from None
    return out


def gguf_metadata(path: str | Path) -> dict[str, Any]:
    """Every metadata field of a GGUF file, decoded."""
    return _open(Path(path))[1]


__all__ = ["GGUFCheckpoint", "QuantizedTensor", "SUPPORTED_GGUF_ARCHITECTURES", "gguf_metadata", "hf_tensor_name",
           "is_gguf", "permute_rope_rows", "unpermute_rope_rows"]
