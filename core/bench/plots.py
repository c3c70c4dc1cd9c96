"""PNG plots of a benchmark result (matplotlib, Agg backend: no display needed).

* ``speedup.png``: tokens/s of every configuration over hyspec plain decoding, grouped by batch size.
* ``acceptance.png``: per-position acceptance (drafts accepted at position j / drafts) of each method.
* ``bandwidth.png``: tokens/s against batch size, with plain decoding's memory-bandwidth limit.

Each plot uses the lowest temperature of the run (0 when it was measured).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from hyspec.bench.result import OK
from hyspec.errors import HyspecError


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise HyspecError("--plot needs matplotlib (pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ok_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    temps = sorted({r["temperature"] for r in doc["results"]})
    return [r for r in doc["results"] if r["status"] == OK and r["temperature"] == temps[0]]


def write_plots(doc: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write the three PNGs into ``out_dir`` (created); return their paths."""
    plt = _pyplot()
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HyspecError(f"--plot {out_dir}: cannot create the folder: {exc}") from None
    rows = _ok_rows(doc)
    title = doc["machine_label"]
    paths = [_speedup(plt, rows, out_dir / "speedup.png", title),
             _acceptance(plt, rows, out_dir / "acceptance.png", title),
             _bandwidth(plt, rows, out_dir / "bandwidth.png", title)]
    return paths


def _finish(plt, fig, ax, path: Path, title: str, ylabel: str, xlabel: str) -> Path:
    ax.set_ylabel(ylabel)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _speedup(plt, rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(9, 4.5))
    batch_sizes = sorted({r["batch_size"] for r in rows})
    labels = list(dict.fromkeys(r["label"] for r in rows))
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        xs, ys = [], []
        for j, bs in enumerate(batch_sizes):
            row = next((r for r in rows if r["label"] == label and r["batch_size"] == bs), None)
            if row is not None and row["speedup_vs_plain"] is not None:
                xs.append(j + i * width - 0.4 + width / 2)
                ys.append(row["speedup_vs_plain"])
        ax.bar(xs, ys, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(batch_sizes)), [str(b) for b in batch_sizes])
    return _finish(plt, fig, ax, path, title, "speed-up over hyspec plain decoding", "batch size")


def _acceptance(plt, rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        acc = r.get("acceptance") or {}
        per_pos = acc.get("per_position") or []
        if per_pos:
            ax.plot(range(1, len(per_pos) + 1), per_pos, marker="o", label=f"{r['label']} bs {r['batch_size']}")
    if not ax.get_legend_handles_labels()[0]:
        ax.text(0.5, 0.5, "no speculative method drafted in this run", ha="center", transform=ax.transAxes)
    ax.set_ylim(0, 1.05)
    return _finish(plt, fig, ax, path, title, "drafts accepted at this position / drafts", "draft position")


def _bandwidth(plt, rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(r["label"] for r in rows):
        points = sorted((r["batch_size"], r["tokens_per_s"]["median"]) for r in rows if r["label"] == label)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    limits = sorted({(r["batch_size"], r["bandwidth_limit_tokens_per_s"]) for r in rows
                     if r["bandwidth_limit_tokens_per_s"] is not None})
    if limits:
        ax.plot([p[0] for p in limits], [p[1] for p in limits], "k--", label="plain-decoding bandwidth limit")
    batch_sizes = sorted({r["batch_size"] for r in rows})
    ax.set_xscale("log", base=2)
    ax.set_xticks(batch_sizes, [str(b) for b in batch_sizes])
    ax.minorticks_off()
    ax.set_yscale("log")
    return _finish(plt, fig, ax, path, title, "tokens/s", "batch size")
