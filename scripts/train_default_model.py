"""Train hyspec's embedded default target: a small Llama-architecture code LM.

Data: the CPython standard-library sources installed with the running Python
(``sysconfig.get_paths()["stdlib"]``, every ``*.py`` outside site-packages).
Files are held out for validation by a hash of their relative path, so the
split is the same on every machine with the same Python version.

Reproducible: fixed seeds, fixed step count, files read in sorted order.
Resumable: a checkpoint is written every ``--ckpt-every`` steps under
``--work`` and picked up again on restart.

    python scripts/train_default_model.py --out assets/default-target

Runs on CPU in bf16 autocast (AMX/AVX-512-BF16 where present).  The
architecture is plain ``LlamaForCausalLM`` from transformers so that the
result is a standard Hugging Face checkpoint which any loader (hyspec's
included) reads as is.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def stdlib_files() -> tuple[list[Path], list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    train, val = [], []
    for p in files:
        rel = p.relative_to(root).as_posix()
        bucket = int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 50
        (val if bucket == 0 else train).append(p)
    return train, val


def read_text(p: Path) -> str | None:
    try:
        return p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None


def train_tokenizer(files: list[Path], vocab_size: int, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((t for p in files if (t := read_text(p)) is not None), trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "add_bos_token": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    return tok


def encode_corpus(tok, files: list[Path]) -> np.ndarray:
    eos = tok.token_to_id("<|endoftext|>")
    texts = [t for p in files if (t := read_text(p)) is not None]
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, dtype=np.uint16)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(model, data: np.ndarray, seq_len: int, batches: int = 16, batch: int = 8) -> float:
    model.eval()
    g = np.random.default_rng(1234)
    losses = []
    for _ in range(batches):
        starts = g.integers(0, len(data) - seq_len - 1, batch)
        x = torch.from_numpy(np.stack([data[s:s + seq_len + 1] for s in starts]).astype(np.int64))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=x[:, :-1], labels=x[:, :-1])
        losses.append(out.loss.item())
    model.train()
    return float(np.mean(losses))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="assets/default-target")
    ap.add_argument("--work", default=".train-work/default-target", help="checkpoints and token caches")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from transformers import LlamaConfig, LlamaForCausalLM
    from tokenizers import Tokenizer

    out, work = Path(args.out), Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    train_files, val_files = stdlib_files()
    print(f"corpus: {len(train_files)} train files, {len(val_files)} val files from {sysconfig.get_paths()['stdlib']}")

    tok_dir = work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        tok_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        train_tokenizer(train_files, args.vocab_size, tok_dir)
        print(f"tokenizer trained in {time.time() - t0:.0f}s")
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    if not (work / "train.npy").exists():
        np.save(work / "train.npy", encode_corpus(tok, train_files))
        np.save(work / "val.npy", encode_corpus(tok, val_files))
    train_ids, val_ids = np.load(work / "train.npy"), np.load(work / "val.npy")
    print(f"tokens: train {len(train_ids):,}  val {len(val_ids):,}")

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=args.hidden, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=2048, rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=tok.token_to_id("<|endoftext|>"), eos_token_id=tok.token_to_id("<|endoftext|>"),
        pad_token_id=tok.token_to_id("<|endoftext|>"),
    )
    model = LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.1f}M parameters")
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    step, log = 0, []
    ckpt = work / "ckpt.pt"
    if ckpt.exists():  # our own file, written below: weights_only keeps it from unpickling code
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step, log = int(state["step"]), json.loads(state["log"])
        print(f"resumed at step {step}")

    rng = np.random.default_rng(args.seed)
    rng.bit_generator.advance(step * args.batch)  # same batches whether resumed or not
    model.train()
    t_start, toks = time.time(), 0
    while step < args.steps:
        starts = rng.integers(0, len(train_ids) - args.seq_len - 1, args.batch)
        x = torch.from_numpy(np.stack([train_ids[s:s + args.seq_len] for s in starts]).astype(np.int64))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args.steps, args.lr, args.warmup)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        toks += x.numel()
        if step % 10 == 0:
            rate = toks / (time.time() - t_start)
            print(f"step {step}/{args.steps} loss {loss.item():.3f} lr {lr_at(step, args.steps, args.lr, args.warmup):.2e} {rate:.0f} tok/s", flush=True)
        if step % args.ckpt_every == 0 or step == args.steps:
            val = evaluate(model, val_ids, args.seq_len)
            log.append({"step": step, "train_loss": loss.item(), "val_loss": val})
            print(f"  val loss {val:.3f}", flush=True)
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "log": json.dumps(log)},
                       work / "ckpt.tmp")
            os.replace(work / "ckpt.tmp", ckpt)

    # Write to a temporary directory and rename, so a half-written output never looks complete.
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # Shards under 40 MB: no single file in the repository is over 50 MB.
    model.to(torch.bfloat16).save_pretrained(tmp, safe_serialization=True, max_shard_size="40MB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / name, tmp / name)
    final = log[-1]
    (tmp / "training_log.json").write_text(json.dumps({
        "args": vars(args), "parameters": n_params, "train_tokens": len(train_ids), "val_tokens": len(val_ids),
        "python": sys.version.split()[0], "torch": torch.__version__, "log": log}, indent=1))
    print(f"final val loss {final['val_loss']:.3f} ({math.exp(final['val_loss']):.1f} ppl)")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
