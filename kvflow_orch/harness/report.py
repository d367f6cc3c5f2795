"""A sweep's results as a table, JSON and matplotlib plots (the target checks are in :mod:`.targets`).

One row per (scenario, system): latency (mean end-to-end workflow time), speedup over ``hicache``
and over ``gpu-only``, gap to ``infinite`` (latency / infinite - 1), device-hit ratio; each
scenario also reports the ``belady`` gap of ``kvflow`` (kvflow / belady - 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

from .sweep import ScenarioResult

__all__ = ["config_label", "rows", "format_table", "write_json", "plot"]


def config_label(sr: ScenarioResult) -> str:
    s = sr.scenario
    lab = s.workload.labels
    size = f"{lab.get('fixed')}/{lab.get('dynamic')}/{lab.get('output')}"
    if s.workload.name in ("synthetic", "concurrent"):
        text = size + (f" b{lab['branches']}" if lab.get("branches", 1) > 1 else "")
        if lab.get("instances", 1) > 1 or s.group.startswith("concurrent"):
            text += f" x{lab['instances']}"
    else:
        name = s.workload.name.removeprefix("replay:").removesuffix(".jsonl")
        text = f"{name} x{lab.get('instances', 1)}"
    if "@" in s.hardware.name:
        text += f" @{s.hardware.effective_link_bandwidth / 1e9:g}GB/s"
    return text


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def rows(results: Iterable[ScenarioResult]) -> list[dict[str, Any]]:
    out = []
    for sr in results:
        base = {n: sr.latency(n) for n in ("hicache", "gpu-only", "infinite", "belady", "kvflow")}
        belady_gap = _ratio(base["kvflow"], base["belady"])
        for name, r in sr.results.items():
            inf = _ratio(r.latency_s, base["infinite"])
            out.append({
                "group": sr.scenario.group, "hardware": sr.scenario.hardware.name,
                "model": sr.scenario.model.name, "config": config_label(sr), "workload": r.workload,
                "labels": dict(r.labels), "system": name, "latency_s": r.latency_s,
                "makespan_s": r.makespan_s, "requests": r.requests,
                "speedup_vs_hicache": _ratio(base["hicache"], r.latency_s),
                "speedup_vs_gpu_only": _ratio(base["gpu-only"], r.latency_s),
                "gap_to_infinite": None if inf is None else inf - 1.0,
                "device_hit_ratio": r.device_hit_ratio,
                "belady_gap": None if belady_gap is None else belady_gap - 1.0,
                "device_tokens": r.device_tokens, "host_tokens": r.host_tokens,
                "stats": dict(r.stats), "h2d_busy_s": r.h2d_busy_s, "compute_busy_s": r.compute_busy_s,
            })
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_table(table: Sequence[dict[str, Any]]) -> str:
    head = f"{'group':<22} {'config':<26} {'system':<13} {'latency s':>10} {'vs hicache':>10} " \
           f"{'vs gpu-only':>11} {'gap to inf':>10} {'dev hit':>8}"
    lines = [head, "-" * len(head)]
    last = None
    for row in table:
        key = (row["group"], row["hardware"], row["model"], row["config"])
        if last is not None and key != last:
            lines.append("")
        last = key
        lines.append(
            f"{row['group']:<22} {row['config']:<26} {row['system']:<13} {row['latency_s']:>10.2f} "
            f"{_fmt(row['speedup_vs_hicache'], '.3f'):>10} {_fmt(row['speedup_vs_gpu_only'], '.3f'):>11} "
            f"{_fmt(row['gap_to_infinite'], '+.1%'):>10} {row['device_hit_ratio']:>8.1%}"
        )
    return "\n".join(lines)


def write_json(table: Sequence[dict[str, Any]], meta: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "rows": list(table)}, indent=1, sort_keys=True) + "\n")
    return path


# ---- plots ---------------------------------------------------------------------------------
COLORS = {"gpu-only": "#9e9e9e", "hicache": "#5b8def", "kvflow-evict": "#f2a541", "kvflow": "#d1495b",
          "belady": "#2e933c", "infinite": "#222222"}


def plot(results: Sequence[ScenarioResult], outdir: Path, prefix: str = "") -> list[Path]:
    """One PNG per group: speedup over gpu-only, one bar per system and configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    groups: dict[str, list[ScenarioResult]] = {}
    for sr in results:
        groups.setdefault(sr.scenario.group, []).append(sr)
    paths = []
    for group, items in groups.items():
        systems = [s for s in COLORS if any(s in sr.results for sr in items)]
        labels = [config_label(sr) for sr in items]
        width = 0.8 / max(1, len(systems))
        fig, ax = plt.subplots(figsize=(max(5.0, 0.55 * len(items) * max(1, len(systems)) / 3 + 2), 3.2))
        for i, name in enumerate(systems):
            ys = [_ratio(sr.latency("gpu-only"), sr.latency(name)) or 0.0 for sr in items]
            xs = [k + (i - (len(systems) - 1) / 2) * width for k in range(len(items))]
            ax.bar(xs, ys, width, label=name, color=COLORS[name])
        ax.axhline(1.0, color="black", linewidth=0.6)
        top = max((_ratio(sr.latency("gpu-only"), sr.latency(n)) or 0.0) for sr in items for n in systems)
        ax.set_ylim(0, top * 1.3)  # headroom for the legend
        ax.set_xticks(range(len(items)))
        ax.set_xticklabels(labels, rotation=35, ha="right", fontsize=7)
        ax.set_ylabel("speedup over gpu-only", fontsize=8)
        first = items[0].scenario
        ax.set_title(f"{group}: {first.model.name} on {first.hardware.name.split('@')[0]}", fontsize=9)
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=6, ncol=6, frameon=False, loc="upper center")
        fig.tight_layout()
        path = outdir / f"{prefix}{group}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths
