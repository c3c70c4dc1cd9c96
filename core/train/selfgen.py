"""``--self-generate N``: training windows made of the target's own continuations.

A drafter is judged on how well it predicts what the *target* will emit,
given contexts the target itself produced.  Prompts are cut from the data;
hyspec's engine decodes them plainly (greedy by default, the setting the
lossless identity guarantee and the benchmarks use; ``temperature > 0``
samples with a per-prompt seed), and each window is ``prompt + continuation``
with only the continuation's next-token predictions counted.  The result is
cached in the working folder, so a resumed run does not generate again.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Sequence

import torch

from hyspec import LLM, SamplingParams
from hyspec.errors import HyspecError
from hyspec.model.config import ModelConfig
from hyspec.train.data import Windows


CHUNK = 256  # prompts generated between two saves of the cache


def make_generator(target_dir: Path, seq_len: int, dtype: str = "auto"):
    """hyspec's engine over the target, sized for a batch of ``seq_len`` windows (plain decoding)."""
    cfg = ModelConfig.from_pretrained(target_dir)
    batch = 64
    # Enough KV for a full batch of windows with headroom (fp32 at most: twice the bf16 figure); the engine
    # would otherwise size its pool from free memory.
    kv_bytes = int(1.5 * batch * (seq_len + 16) * cfg.kv_bytes_per_token * 2)
    # Dense weights (a GGUF's blocks dequantized): for 64 rows at a time a BLAS matmul beats the
    # one-token quantized kernels (measured 130 vs 97 tok/s on a 2-core Zen 3), and the tokens are the same
    # (scripts/check_quantized_numerics.py: the quantized path is token-identical to dense fp32).
    return LLM(str(target_dir), dtype=dtype, max_model_len=seq_len + 1, kv_cache_bytes=max(kv_bytes, 1 << 22),
               max_num_seqs=batch, quantization="none")


def read_prompt_records(path: Path, tokenizer, prompt_len: int) -> list[list[int]]:
    """Token ids of the prompts in a JSONL file (``hyspec.train.instructions`` writes one).

    A record is ``{"messages": [...]}`` (rendered through the target's chat template, the assistant turn
    opened) or ``{"prompt": "..."}`` (raw text).  A prompt longer than ``prompt_len`` tokens keeps its end,
    where the answer starts.  Errors name the file and the line.
    """
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise HyspecError(f"--self-generate-prompts {path}: cannot read: {exc}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HyspecError(f"--self-generate-prompts {path} line {number}: not valid JSON ({exc.msg})") from None
        if isinstance(record, dict) and isinstance(record.get("messages"), list):
            text = tokenizer.apply_chat_template(record["messages"])
        elif isinstance(record, dict) and isinstance(record.get("prompt"), str):
            text = record["prompt"]
        else:
            raise HyspecError(f"--self-generate-prompts {path} line {number}: expected an object with a "
                              f"'messages' list or a 'prompt' string")
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not ids:
            raise HyspecError(f"--self-generate-prompts {path} line {number}: the prompt has no tokens")
        prompts.append(ids[-prompt_len:])
    if not prompts:
        raise HyspecError(f"--self-generate-prompts {path}: the file holds no prompt")
    return prompts


def temperature_of(temperatures: float | Sequence[float], index: int) -> float:
    """Prompt ``index``'s temperature: one value for all, or a list cycled over the prompts."""
    if isinstance(temperatures, (int, float)):
        return float(temperatures)
    return float(temperatures[index % len(temperatures)])


def generate_windows(llm, prompts: list[list[int]], seq_len: int, temperature: float | Sequence[float], seed: int,
                     pad_id: int, first_index: int = 0, progress: bool = False) -> Windows:
    """One ``[seq_len]`` window per prompt: prompt, then up to ``seq_len - len(prompt)`` generated tokens.

    Prompt ``i`` samples at :func:`temperature_of` ``(temperature, first_index + i)`` with seed
    ``f(seed, first_index + i)``, so chunks of one prompt list reproduce it whole.
    """
    max_prompt = max(len(p) for p in prompts)
    if max_prompt >= seq_len:
        raise ValueError(f"self-generation prompts ({max_prompt} tokens) leave no room in --seq-len {seq_len}")
    params = []
    for i, p in enumerate(prompts):
        t = temperature_of(temperature, first_index + i)
        params.append(SamplingParams(temperature=t, max_tokens=seq_len - len(p),
                                     seed=None if t == 0 else seed * 1_000_003 + first_index + i))
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=progress)
    ids = torch.full((len(prompts), seq_len), pad_id, dtype=torch.int64)
    mask = torch.zeros(len(prompts), seq_len, dtype=torch.bool)
    for row, (prompt, out) in enumerate(zip(prompts, outs)):
        tokens = (prompt + list(out.outputs[0].token_ids))[:seq_len]
        ids[row, : len(tokens)] = torch.tensor(tokens)
        # position t predicts token t+1: count the predictions of generated tokens only
        mask[row, len(prompt) - 1: len(tokens) - 1] = True
    return Windows(ids=ids, loss_mask=mask)


def cached_generate(cache_file: Path, target_dir: Path, target_key: str, prompts: list[list[int]], seq_len: int,
                    temperature: float | Sequence[float], seed: int, pad_id: int, dtype: str, progress: bool) -> Windows:
    """:func:`generate_windows` over all prompts, saved to ``cache_file`` chunk by chunk.

    A cache made from the same settings is reused chunk by chunk as far as its prompts agree (and then
    completed), so an interrupted generation resumes, several runs share one file, and a run over the
    first N prompts of a list uses what a run over the whole list generated.
    """
    t_key = temperature if isinstance(temperature, (int, float)) else list(temperature)
    key = hashlib.sha1(json.dumps([target_key, seq_len, t_key, seed, pad_id, dtype, CHUNK]).encode()).hexdigest()
    wanted = [_chunk_hash(prompts[start: start + CHUNK]) for start in range(0, len(prompts), CHUNK)]
    saved = {"key": key, "chunks": [], "ids": [], "loss_mask": []}
    if cache_file.is_file():
        old = torch.load(cache_file, weights_only=True)
        if old.get("key") == key and "chunks" in old:
            saved = old
    # Chunk k of the cache serves chunk k of these prompts if it answered the same prompts (same settings):
    # a run over the first N prompts of a longer list reuses it, and a longer run extends it.
    usable = 0
    stored = min(len(saved["chunks"]), len(saved["ids"]), len(saved["loss_mask"]))
    while usable < min(len(wanted), stored) and saved["chunks"][usable] == wanted[usable]:
        usable += 1
    if usable < len(wanted):  # what follows the first differing chunk is regenerated
        for name in ("chunks", "ids", "loss_mask"):
            saved[name] = saved[name][:usable]
    llm = None
    for k in range(usable, len(wanted)):
        start = k * CHUNK
        if llm is None:
            llm = make_generator(target_dir, seq_len, dtype)
        if progress:
            print(f"train-draft: self-generating windows {start}-{min(start + CHUNK, len(prompts))} "
                  f"of {len(prompts)}", flush=True)
        w = generate_windows(llm, prompts[start: start + CHUNK], seq_len, temperature, seed, pad_id,
                             first_index=start, progress=progress)
        saved["chunks"].append(wanted[k])
        saved["ids"].append(w.ids)
        saved["loss_mask"].append(w.loss_mask)
        tmp = cache_file.with_name(cache_file.name + ".tmp")
        torch.save(saved, tmp)
        tmp.replace(cache_file)
    n = len(wanted)
    return Windows(ids=torch.cat(saved["ids"][:n]), loss_mask=torch.cat(saved["loss_mask"][:n]))


def _chunk_hash(prompts: list[list[int]]) -> str:
    return hashlib.sha1(json.dumps(prompts).encode()).hexdigest()
