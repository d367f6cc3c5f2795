"""A PNG timeline of the LLM calls of several runs, one panel per run, one row per agent: each call
a bar from when it was sent to when its reply came back, coloured by how much of its prompt the
server had to recompute. Needs matplotlib (the ``bench`` extra, installed by ``.ci/setup``)."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from kvflow_orch.protocol import CallRecord

__all__ = ["write_timeline", "HIT_SHARE"]

HIT_SHARE = 0.5
"""A call whose cached share of the prompt is at least this is drawn as a hit."""

_COLORS = {"hit": "#2e8b57", "miss": "#d9534f"}


def write_timeline(runs: Mapping[str, Sequence[CallRecord]], path: Path, *, title: str = "") -> Path:
    """Draw ``runs`` (panel title -> its calls) on one time axis and write the PNG to ``path``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed, none opened
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    agents: list[str] = []
    for calls in runs.values():
        for call in calls:
            if call.agent not in agents:
                agents.append(call.agent)
    end = max((c.offset_s + c.duration_s for calls in runs.values() for c in calls), default=1.0)
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 1.4 + 0.32 * len(agents) * len(runs)), sharex=True,
                             squeeze=False)
    for ax, (name, calls) in zip(axes[:, 0], runs.items(), strict=True):
        for call in calls:
            hit = call.prompt_tokens and call.cached_tokens / call.prompt_tokens >= HIT_SHARE
            ax.barh(agents.index(call.agent), call.duration_s, left=call.offset_s, height=0.7,
                    color=_COLORS["hit" if hit else "miss"], edgecolor="white", linewidth=0.5)
        wall = max((c.offset_s + c.duration_s for c in calls), default=0.0)
        ax.set_title(f"{name}: {wall:.1f} s", fontsize=9, loc="left")
        ax.set_yticks(range(len(agents)), agents, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, end * 1.02)
        ax.grid(axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the workflow started", fontsize=8)
    fig.legend(handles=[Patch(color=_COLORS["miss"], label="prompt mostly recomputed"),
                        Patch(color=_COLORS["hit"], label="prompt mostly from cache")],
               loc="lower center", fontsize=7, frameon=False, ncol=2)
    if title:
        fig.suptitle(title, fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0.05, 1, 0.95))  # room for the title above and the legend below
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
