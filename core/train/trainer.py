"""``hyspec train-draft``: distil a drafter from a frozen target, resumably, with atomic output.

The trainer owns everything that is not method-specific: data, the frozen
target and its features (:mod:`hyspec.train.features`), AdamW with linear
warm-up and cosine decay, gradient clipping, bf16 autocast where the CPU has
native bf16, progress bars, checkpoints every N steps and the output folder
(:mod:`hyspec.train.workspace`).  A recipe (:mod:`hyspec.train.base`) brings
the drafter, its loss and its checkpoint layout.

Resuming is exact: step ``n``'s batch is a function of ``(seed, n)``, and the
checkpoint holds the drafter, the optimiser, torch's RNG state and the
running log, so an interrupted-and-resumed run ends with the same weights as
an uninterrupted one.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from hyspec import __version__
from hyspec.errors import CheckpointError, ConfigError, HyspecError
from hyspec.model.config import ModelConfig
from hyspec.model.gguf_checkpoint import is_gguf
from hyspec.model.loader import load_model
from hyspec.model.tokenizer import Tokenizer
from hyspec.train.base import DrafterRecipe
from hyspec.train.data import BatchSampler, Corpus, DataStats, Windows, load_corpus, pack_windows, sample_prompts
from hyspec.train.features import FeatureSource, HiddenCache
from hyspec.train.registry import resolve_recipe
from hyspec.train.selfgen import cached_generate, read_prompt_records
from hyspec.train.workspace import LOG_FILE, Workspace, check_out_dir

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "bf16", "fp32")
# Settings that change the trained weights: a checkpoint resumes only under the same values.
_RUN_KEYS = ("method", "steps", "batch_size", "seq_len", "lr", "min_lr_ratio", "warmup", "weight_decay",
             "grad_clip", "seed", "options", "precision", "target_dtype", "self_generate",
             "self_generate_temperature", "self_generate_prompts", "prompt_len", "max_tokens", "holdout",
             "init_from")


@dataclass
class TrainConfig:
    method: str
    target: Path
    data: list[str]
    out: Path
    steps: int = 1000
    batch_size: int = 8
    seq_len: int = 256
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # the cosine decays to lr * min_lr_ratio
    warmup: int | None = None  # None: min(100, steps // 10)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # method options (--layers, --option k=v, ...)
    resume: bool = False
    # start from a saved drafter of this method (e.g. the one in assets/): training continues across sessions
    # and machines where OUT.partial/ (optimiser state included) did not travel
    init_from: Path | None = None
    overwrite: bool = False
    self_generate: int = 0  # > 0: train on this many target continuations of prompts cut from the data
    self_generate_temperature: float | tuple[float, ...] = 0.0  # 0 = greedy (the default); a tuple cycles over prompts
    self_generate_prompts: Path | None = None  # JSONL of whole prompts (hyspec.train.instructions) instead of cut ones
    prompt_len: int = 64
    self_generate_cache: Path | None = None  # default OUT.partial/self_generated.pt; share one across methods
    cache_hidden: bool = False
    max_tokens: int | None = None  # None: enough text for one pass over all steps
    precision: str = "auto"
    target_dtype: str = "auto"
    holdout: int = 0  # windows kept out of training; scored at every checkpoint (per-position accuracy)
    checkpoint_every: int = 100
    log_every: int = 10
    work_dir: Path | None = None
    keep_work: bool = False
    progress: bool = True

    def __post_init__(self) -> None:
        self.target, self.out = Path(self.target), Path(self.out)
        self.work_dir = None if self.work_dir is None else Path(self.work_dir)
        self.init_from = None if self.init_from is None else Path(self.init_from)
        self.self_generate_cache = None if self.self_generate_cache is None else Path(self.self_generate_cache)
        self.self_generate_prompts = None if self.self_generate_prompts is None else Path(self.self_generate_prompts)
        if not isinstance(self.self_generate_temperature, (int, float)):
            self.self_generate_temperature = tuple(float(t) for t in self.self_generate_temperature)
            if not self.self_generate_temperature:
                raise ConfigError("--self-generate-temperature", "needs at least one value")
        for key in ("steps", "batch_size", "seq_len", "checkpoint_every", "log_every", "prompt_len"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError("--" + key.replace("_", "-"), f"must be a positive integer, got {value!r}")
        if self.seq_len < 2:
            raise ConfigError("--seq-len", f"must be at least 2, got {self.seq_len}")
        if self.warmup is None:
            self.warmup = min(100, self.steps // 10)
        if self.warmup < 0:
            raise ConfigError("--warmup", f"must be >= 0, got {self.warmup}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ConfigError("--lr", f"must be a positive number, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError("--min-lr-ratio", f"must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0 or self.grad_clip <= 0:
            raise ConfigError("--weight-decay/--grad-clip", "weight decay must be >= 0 and grad clip > 0")
        temps = (self.self_generate_temperature,) if isinstance(self.self_generate_temperature, (int, float)) \
            else self.self_generate_temperature
        if self.self_generate < 0 or any(not (t >= 0 and math.isfinite(t)) for t in temps):
            raise ConfigError("--self-generate", "count and temperature must be >= 0")
        if isinstance(self.holdout, bool) or not isinstance(self.holdout, int) or self.holdout < 0:
            raise ConfigError("--holdout", f"must be a non-negative integer, got {self.holdout!r}")
        if (self.self_generate or self.self_generate_prompts) and self.prompt_len >= self.seq_len:
            raise ConfigError("--prompt-len",
                              f"must be shorter than --seq-len ({self.seq_len}) to leave room to generate")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ConfigError("--max-tokens", f"must be positive, got {self.max_tokens}")
        if self.precision not in PRECISIONS:
            raise ConfigError("--precision", f"must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if not self.data and self.self_generate_prompts is None:
            raise ConfigError("--data", "no data given (files, folders, 'stdlib' or 'humaneval')")

    def run_settings(self) -> dict[str, Any]:
        settings = {k: getattr(self, k) for k in _RUN_KEYS}
        settings["self_generate_prompts"] = None if self.self_generate_prompts is None else str(self.self_generate_prompts)
        settings["init_from"] = None if self.init_from is None else init_fingerprint(self.init_from)
        if isinstance(settings["self_generate_temperature"], tuple):
            settings["self_generate_temperature"] = list(settings["self_generate_temperature"])
        return settings


@dataclass
class TrainResult:
    out: Path
    steps: int
    loss: float  # mean over the last logged interval
    metrics: dict[str, float]  # likewise (e.g. acc)
    seconds: float  # training-loop time, summed over resumed runs
    history: list[dict[str, Any]]  # the log entries of training_log.json
    bf16: bool  # trained under bf16 autocast


StepCallback = Callable[[int, float, dict[str, float]], None]  # (steps done, loss, metrics)


def bf16_supported() -> bool:
    """Native bf16 matmuls on this CPU (AVX512-BF16 / AMX): autocast pays off only then."""
    try:
        return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def init_fingerprint(folder: Path) -> str:
    """``--init-from``'s identity for resuming: the folder and a digest of its weights (the folder may be
    the output, which the run replaces only when it ends)."""
    folder = Path(folder)
    h = hashlib.sha1()
    for f in sorted(folder.glob("*.safetensors")):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return f"{folder}@{h.hexdigest()[:16]}"


def previous_log(folder: Path) -> dict[str, Any] | None:
    """The training log a drafter folder carries, if any (kept in the next run's log as its history)."""
    try:
        return json.loads((Path(folder) / LOG_FILE).read_text())
    except (OSError, ValueError):
        return None


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def target_key(target_dir: Path) -> str:
    """Identifies the target's weights cheaply: config.json, shard sizes, and each shard's first and last 64 KiB
    (for a GGUF target, the file's size and its first and last 64 KiB)."""
    target_dir = Path(target_dir)
    gguf_file = is_gguf(target_dir)
    h = hashlib.sha1(b"gguf" if gguf_file else (target_dir / "config.json").read_bytes())
    for shard in [target_dir] if gguf_file else sorted(target_dir.glob("*.safetensors")):
        size = shard.stat().st_size
        h.update(f"{shard.name}:{size}".encode())
        with open(shard, "rb") as f:
            h.update(f.read(1 << 16))
            f.seek(max(0, size - (1 << 16)))
            h.update(f.read())
    return h.hexdigest()


class _Meter:
    """Means of loss and metrics over the steps since the last log entry (saved with checkpoints)."""

    def __init__(self, state: dict[str, float] | None = None):
        self.sums: dict[str, float] = dict(state or {})

    def add(self, loss: float, metrics: dict[str, float]) -> None:
        self.sums["_n"] = self.sums.get("_n", 0.0) + 1
        for k, v in {"loss": loss, **metrics}.items():
            self.sums[k] = self.sums.get(k, 0.0) + float(v)

    def flush(self) -> dict[str, float]:
        n = self.sums.pop("_n", 0.0) or 1.0
        means = {k: v / n for k, v in self.sums.items()}
        self.sums = {}
        return means


def _load_corpus(cfg: TrainConfig, tokenizer: Tokenizer, vocab_size: int) -> Corpus | None:
    if not cfg.data:  # --self-generate-prompts alone: no text besides the prompts
        return None
    if cfg.self_generate_prompts is not None:
        # text mixed in with the generated windows: as many tokens as those hold unless --max-tokens says
        max_tokens = cfg.max_tokens or max(1 << 16, (cfg.self_generate or 1024) * cfg.seq_len)
    elif cfg.self_generate:
        # Only prompts are needed: a bounded amount of text gives plenty of variety, and a cap that does
        # not depend on --steps/--batch-size lets runs of several methods share one --self-generate-cache.
        max_tokens = cfg.max_tokens or max(1 << 16, 8 * cfg.self_generate * cfg.prompt_len)
    else:
        max_tokens = cfg.max_tokens or cfg.steps * cfg.batch_size * cfg.seq_len
    corpus = load_corpus(cfg.data, tokenizer, max_tokens=max_tokens, seed=cfg.seed)
    top = int(corpus.tokens.max())
    if top >= vocab_size:
        raise CheckpointError(f"the tokenizer in {cfg.target} produced id {top}, "
                              f"beyond the model's vocab_size {vocab_size}")
    return corpus


def _windows(cfg: TrainConfig, corpus: Corpus | None, stats: DataStats, tokenizer: Tokenizer,
             ws: Workspace) -> Windows:
    if cfg.self_generate_prompts is not None:
        prompts = read_prompt_records(cfg.self_generate_prompts, tokenizer, cfg.prompt_len)
        if cfg.self_generate:
            prompts = prompts[: cfg.self_generate]
    elif not cfg.self_generate:
        assert corpus is not None
        return pack_windows(corpus, cfg.seq_len)
    else:
        assert corpus is not None
        prompts = sample_prompts(corpus, cfg.self_generate, cfg.prompt_len, cfg.seed)
    pad_id = corpus.pad_id if corpus is not None else (tokenizer.eos_token_id or 0)
    cache_file = cfg.self_generate_cache or ws.folder / "self_generated.pt"
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    windows = cached_generate(cache_file, cfg.target, target_key(cfg.target), prompts,
                              cfg.seq_len, cfg.self_generate_temperature, cfg.seed, pad_id,
                              cfg.target_dtype, cfg.progress)
    stats.self_generated = len(windows)
    if cfg.self_generate_prompts is not None and corpus is not None:  # real text, teacher-forced, mixed in
        text = pack_windows(corpus, cfg.seq_len)
        windows = Windows(ids=torch.cat([windows.ids, text.ids]), loss_mask=torch.cat([windows.loss_mask,
                                                                                        text.loss_mask]))
    stats.windows = len(windows)
    return windows


def predicted_token_counts(windows: Windows, vocab_size: int) -> torch.Tensor:  # [V] int64
    """How often each token is one the drafter must predict (the next token at a counted position):
    what a reduced draft vocabulary is chosen from."""
    nxt = windows.ids[:, 1:][windows.loss_mask[:, :-1]]
    return torch.bincount(nxt, minlength=vocab_size)[:vocab_size]


def split_holdout(windows: Windows, count: int, seed: int) -> tuple[Windows, Windows | None]:
    """(training windows, held-out windows): ``count`` windows drawn by ``seed``, never trained on."""
    if count == 0:
        return windows, None
    if count >= len(windows):
        raise HyspecError(f"--holdout {count} leaves no training window (the data has {len(windows)})")
    perm = torch.randperm(len(windows), generator=torch.Generator().manual_seed(seed * 7919 + 1))
    held, kept = perm[:count].sort().values, perm[count:].sort().values
    return (Windows(ids=windows.ids[kept], loss_mask=windows.loss_mask[kept]),
            Windows(ids=windows.ids[held], loss_mask=windows.loss_mask[held]))


def _optimizer(recipe: DrafterRecipe, drafter: torch.nn.Module,
               cfg: TrainConfig) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    params = recipe.trainable_parameters(drafter)
    if not params:
        raise HyspecError(f"the {cfg.method} recipe exposes no trainable parameters")
    decay = [p for p in params if p.ndim >= 2]  # matrices decay; norms and biases do not
    rest = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.lr, betas=(0.9, 0.95)), params


def train(cfg: TrainConfig, callback: StepCallback | None = None) -> TrainResult:
    """Train ``cfg.method``'s drafter for ``cfg.target`` and write it to ``cfg.out``."""
    t_start = time.time()
    recipe = resolve_recipe(cfg.method)
    # Continuing a drafter in place (--init-from OUT) replaces it by intent, as --overwrite would.
    in_place = cfg.init_from is not None and cfg.out.resolve() == cfg.init_from.resolve()
    check_out_dir(cfg.out, cfg.overwrite or in_place)
    init_log = None
    if cfg.init_from is not None:
        if not (cfg.init_from / "config.json").is_file():
            raise HyspecError(f"--init-from {cfg.init_from}: no drafter there (config.json is missing)")
        init_log = previous_log(cfg.init_from)
    target_cfg = ModelConfig.from_pretrained(cfg.target)
    tokenizer = Tokenizer(cfg.target)
    ws = Workspace(cfg.out, cfg.work_dir)
    if ws.checkpoint.is_file() and not (cfg.resume or cfg.overwrite):
        raise HyspecError(f"{ws.folder} holds a checkpoint of an earlier run: pass --resume to continue it "
                          "or --overwrite to start over")
    corpus = _load_corpus(cfg, tokenizer, target_cfg.vocab_size)
    stats = corpus.stats if corpus is not None else DataStats(sources=[str(cfg.self_generate_prompts)])
    target = load_model(cfg.target, dtype=cfg.target_dtype)
    options = dict(cfg.options)
    counts_from_data = recipe.wants_token_counts and options.get("token_counts") is None
    if counts_from_data:  # stand-in counts until the windows exist: the options are checked before any folder is made
        options["token_counts"] = [1] * target_cfg.vocab_size
    torch.manual_seed(cfg.seed)
    drafter = recipe.build(target, options)
    optimizer, params = _optimizer(recipe, drafter, cfg)
    ws.open()
    try:
        t_data = time.time()
        windows = _windows(cfg, corpus, stats, tokenizer, ws)
        t_data = time.time() - t_data
        settings = {**cfg.run_settings(), "target": target_key(cfg.target), "data": windows.fingerprint()}
        windows, heldout = split_holdout(windows, cfg.holdout, cfg.seed)
        if counts_from_data:  # e.g. EAGLE-3's reduced vocabulary: the tokens the training data asks it to predict
            options["token_counts"] = predicted_token_counts(windows, target_cfg.vocab_size).tolist()
            torch.manual_seed(cfg.seed)
            drafter = recipe.build(target, options)
            optimizer, params = _optimizer(recipe, drafter, cfg)
        if cfg.init_from is not None:  # before the checkpoint: a resumed run overwrites these weights anyway
            recipe.load_weights(drafter, target, cfg.init_from)
            print(f"train-draft: starting from the {cfg.method} drafter in {cfg.init_from}")
        state = ws.load_checkpoint() if cfg.resume else None
        if state is not None:
            changed = sorted(k for k in settings if state["settings"].get(k) != settings[k])
            if changed:
                raise HyspecError(f"the checkpoint in {ws.folder} was made with different {', '.join(changed)}; "
                                  "resume with the same settings, or pass --overwrite without --resume")
            drafter.load_state_dict(state["drafter"])
            optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["rng"])
            print(f"train-draft: resuming {cfg.method} at step {state['step']}/{cfg.steps} from {ws.checkpoint}")
        result = _loop(cfg, recipe, target, drafter, optimizer, params, windows, heldout, ws, settings, state,
                       callback)
        _write_output(cfg, recipe, target_cfg, drafter, ws, stats, windows, result,
                      {"windows_s": round(t_data, 2), "total_s": round(time.time() - t_start, 2)},
                      resumed_from=None if state is None else int(state["step"]),
                      init_from=None if cfg.init_from is None else {"folder": settings["init_from"],
                                                                    "log": init_log})
        ws.publish(keep_work=cfg.keep_work)
        return result
    except KeyboardInterrupt:
        print(f"train-draft: interrupted; rerun the same command with --resume to continue from the last "
              f"checkpoint in {ws.folder} (one every {cfg.checkpoint_every} steps)", file=sys.stderr)
        raise
    finally:
        ws.close()


def _loop(cfg: TrainConfig, recipe: DrafterRecipe, target, drafter, optimizer, params, windows: Windows,
          heldout: Windows | None, ws: Workspace, settings: dict[str, Any], state: dict[str, Any] | None,
          callback: StepCallback | None) -> TrainResult:
    from tqdm.auto import tqdm

    use_bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and bf16_supported())
    aux_layers = tuple(recipe.aux_layers(target.config))
    cache = None
    if cfg.cache_hidden:
        key = hashlib.sha1(json.dumps([settings["target"], settings["data"], aux_layers, use_bf16,
                                       cfg.target_dtype]).encode()).hexdigest()
        cache = HiddenCache(ws.folder / "hidden", windows, target.config.hidden_size, aux_layers, key)
    features = FeatureSource(target, windows, aux_layers, cache)
    held_features = None if heldout is None else _HeldOut(FeatureSource(target, heldout, aux_layers, None),
                                                          len(heldout), cfg.batch_size)
    sampler = BatchSampler(len(windows), cfg.batch_size, cfg.seed)
    step = 0 if state is None else int(state["step"])
    history: list[dict[str, Any]] = [] if state is None else json.loads(state["log"])
    meter = _Meter(None if state is None else json.loads(state["meter"]))
    train_s = 0.0 if state is None else float(state["train_s"])
    drafter.train()
    loss_value, metrics = float("nan"), {}
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train-draft {cfg.method}", unit="step",
               disable=not cfg.progress, dynamic_ncols=True)
    while step < cfg.steps:
        t0 = time.perf_counter()
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            batch = features.batch(sampler.indices(step))
            loss, metrics = recipe.loss(drafter, target, batch)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise HyspecError(f"the loss became {loss_value} at step {step + 1}; lower --lr (now {cfg.lr})")
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        train_s += time.perf_counter() - t0
        meter.add(loss_value, metrics)
        if step % cfg.log_every == 0 or step == cfg.steps:
            history.append({"step": step, **{k: round(v, 5) for k, v in meter.flush().items()},
                            "lr": lr, "grad_norm": round(grad_norm, 4), "epoch": round(sampler.epoch(step), 3),
                            "train_s": round(train_s, 2)})
        bar.set_postfix(_postfix(loss_value, metrics), refresh=False)
        bar.update(1)
        if callback is not None:
            callback(step, loss_value, metrics)
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            if held_features is not None:
                history.append({"step": step, "heldout": evaluate(recipe, target, drafter, held_features.batches(),
                                                                  use_bf16)})
                drafter.train()
            ws.save_checkpoint({"step": step, "drafter": drafter.state_dict(), "optimizer": optimizer.state_dict(),
                                "rng": torch.get_rng_state(), "settings": settings, "log": json.dumps(history),
                                "meter": json.dumps(meter.sums), "train_s": train_s})
    bar.close()
    trained = [h for h in history if "loss" in h]
    last = trained[-1] if trained else {"loss": loss_value}
    return TrainResult(out=cfg.out, steps=step, loss=float(last.get("loss", loss_value)),
                       metrics={k: v for k, v in last.items() if k not in _LOG_FIELDS}, seconds=train_s,
                       history=history, bf16=use_bf16)


_LOG_FIELDS = ("step", "loss", "lr", "grad_norm", "epoch", "train_s")


class _HeldOut:
    """The held-out windows' target features, computed at the first evaluation and kept in memory
    (a target forward per evaluation would cost as much as many training steps)."""

    def __init__(self, features: FeatureSource, count: int, batch_size: int):
        self.features, self.count, self.batch_size = features, count, batch_size
        self._batches: list | None = None

    def batches(self) -> list:
        if self._batches is None:
            self._batches = [self.features.batch(torch.arange(start, min(self.count, start + self.batch_size)))
                             for start in range(0, self.count, self.batch_size)]
        return self._batches


def evaluate(recipe: DrafterRecipe, target, drafter, batches: list, use_bf16: bool) -> dict[str, float]:
    """The recipe's metrics over the held-out windows (means weighted by batch), plus, where it logs
    per-position accuracies ``acc0, acc1, ...``, the mean accepted length of a chain draft they imply
    (``1 + sum_k prod_{j<=k} acc_j``: each position's accuracy is conditional on the earlier ones being right)."""
    drafter.eval()
    sums: dict[str, float] = {}
    count = 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
        for batch in batches:
            loss, metrics = recipe.loss(drafter, target, batch)
            rows = batch.input_ids.shape[0]
            count += rows
            for k, v in {"loss": float(loss), **metrics}.items():
                sums[k] = sums.get(k, 0.0) + float(v) * rows
    out = {k: round(v / count, 5) for k, v in sums.items()}
    accs = [out[f"acc{j}"] for j in range(len(out)) if f"acc{j}" in out]
    if accs:
        length, run = 1.0, 1.0
        for a in accs:
            run *= a
            length += run
        out["chain_accept_len"] = round(length, 4)
    return out


def _postfix(loss: float, metrics: dict[str, float]) -> dict[str, str]:
    shown = {"loss": f"{loss:.3f}"}
    for k in sorted(metrics):
        if k.startswith("acc") and len(shown) < 6:  # per-position accuracies; the bar stays one line
            shown[k] = f"{metrics[k]:.2f}"
    return shown


def _write_output(cfg: TrainConfig, recipe: DrafterRecipe, target_cfg: ModelConfig, drafter, ws: Workspace,
                  stats: DataStats, windows: Windows, result: TrainResult, times: dict[str, float],
                  resumed_from: int | None, init_from: dict[str, Any] | None = None) -> None:
    staging = ws.fresh_staging()
    drafter.eval()
    recipe.save(drafter, cfg.target, staging)
    if not (staging / "config.json").is_file():
        raise HyspecError(f"the {cfg.method} recipe wrote no config.json into its output")
    args = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()}
    record = {
        "method": cfg.method,
        "target": str(cfg.target),
        "target_model": {"hidden_size": target_cfg.hidden_size, "num_hidden_layers": target_cfg.num_hidden_layers,
                         "vocab_size": target_cfg.vocab_size},
        "args": args,
        "data": {**stats.to_dict(), "seq_len": windows.seq_len, "counted_positions": int(windows.loss_mask.sum())},
        "trainable_parameters": sum(p.numel() for p in recipe.trainable_parameters(drafter)),
        "precision": "bf16 autocast" if result.bf16 else "fp32",
        "resumed_from_step": resumed_from,
        "init_from": init_from,  # the drafter this run started from, with its own log: the whole history
        "final": {"step": result.steps, "loss": result.loss, **result.metrics},
        "log": result.history,
        "time": {**times, "train_s": round(result.seconds, 2),
                 "seconds_per_step": round(result.seconds / max(1, result.steps), 4)},
        "versions": {"hyspec": __version__, "torch": torch.__version__, "python": platform.python_version()},
    }
    (staging / LOG_FILE).write_text(json.dumps(record, indent=1) + "\n")
