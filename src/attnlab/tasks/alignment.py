"""Attention alignment heatmaps: source tokens on the x axis, output tokens on the y axis."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_alignment(attn: np.ndarray, src: list[str], tgt: list[str], path: Path, title: str | None = None) -> Path:
    """attn (len(tgt), len(src)) -> a PNG at `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h, w = attn.shape
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * w + 1.5), max(3.0, 0.4 * h + 1.2)))
    ax.imshow(attn, cmap="viridis", aspect="auto", vmin=0.0, vmax=max(1e-6, float(attn.max())))
    ax.set_xticks(range(w), src[:w], rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(h), tgt[:h], fontsize=8)
    ax.set_xlabel("source")
    ax.set_ylabel("translation")
    if title:
        ax.set_title(title if len(title) < 70 else title[:67] + "...", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return Path(path)
