"""docs/peers.png from results.json; runs in the report venv (matplotlib).

python -m bench.peers.chart bench/peers/results.json docs/peers.png
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter

QW_COLOR, PEER_COLOR, LIGHT = "#d1495b", "#5b7b9a", "#a9bccf"


def _value(doc: dict[str, Any], key: str, name: str, field: str) -> float | None:
    r = doc["results"].get(key, {}).get(name)
    if not r or "error" in r:
        return None
    return float(r[field])


def _bars(
    ax: Axes, labels: list[str], keys: list[str], values: list[float | None], log: bool = False
) -> None:
    ys = list(range(len(keys)))
    shown = [v or 0.0 for v in values]
    colors = [QW_COLOR if k.startswith("queueworks") else PEER_COLOR for k in keys]
    ax.barh(ys, shown, color=colors)
    ax.set_yticks(ys, labels)
    ax.invert_yaxis()
    top = max(shown, default=1) or 1
    for y, v in zip(ys, values, strict=True):
        text = "n/a" if v is None else f"{v:,.0f}" if v >= 10 else f"{v:,.1f}"
        ax.text(v or (1 if log else 0), y, f" {text}", va="center", fontsize=8)
    if log:
        ax.set_xscale("log")
        low = min((v for v in shown if v > 0), default=1)
        ax.set_xlim(10 ** math.floor(math.log10(low)), top * 6)
    else:
        ax.set_xlim(0, top * 1.25)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))


def main(results: str, png: str) -> None:
    with open(results) as f:
        doc = json.load(f)
    keys = list(doc["results"])
    labels = [doc["systems"][k]["label"] for k in keys]
    give_up = doc["params"]["give_up_s"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.5))
    (a1, a2, a3), (a4, a5, a6) = axes

    _bars(a1, labels, keys, [_value(doc, k, "throughput_2", "jobs_per_s") for k in keys], log=True)
    a1.set_title("No-op throughput, 2 worker processes\njobs/s, log scale, higher is better")
    _bars(a2, labels, keys, [_value(doc, k, "enqueue", "jobs_per_s") for k in keys], log=True)
    a2.set_title(
        f"Enqueue {doc['params']['enqueue_n']:,} jobs\njobs/s, log scale, higher is better"
    )
    _bars(a3, labels, keys, [_value(doc, k, "enqueue", "mb_per_100k") for k in keys])
    a3.set_title("Redis memory per 100,000 queued jobs\nMB, lower is better")

    # latency: p50 bar with the p99 as a lighter bar behind it, log scale
    ys = list(range(len(keys)))
    p50 = [_value(doc, k, "latency", "p50_ms") or 0.0 for k in keys]
    p99 = [_value(doc, k, "latency", "p99_ms") or 0.0 for k in keys]
    a4.barh(ys, p99, color=LIGHT, label="p99")
    colors = [QW_COLOR if k.startswith("queueworks") else PEER_COLOR for k in keys]
    a4.barh(ys, p50, color=colors, label="p50")
    a4.set_xscale("log")
    a4.set_yticks(ys, labels)
    a4.invert_yaxis()
    for y, a, b in zip(ys, p50, p99, strict=True):
        a4.text(max(b, 0.1), y, f" {a:.1f} / {b:.1f}", va="center", fontsize=8)
    low = min((v for v in p50 if v > 0), default=1.0)
    a4.set_xlim(min(1.0, 10 ** math.floor(math.log10(low))), max(p99, default=10) * 8)
    a4.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}" if x >= 1 else f"{x:g}"))
    a4.set_title(
        f"Latency at {doc['params']['latency_rate']:.0f} jobs/s, p50 (dark) / p99 (light)\n"
        "ms, log scale, lower is better"
    )

    # recovery: seconds until the job runs again; hatched = never within the give-up time
    rec: list[float | None] = []
    for k in keys:
        r = doc["results"].get(k, {}).get("recovery")
        rec.append(None if not r or "error" in r else r["seconds"] if r["recovered"] else math.inf)
    shown = [give_up if v is not None and math.isinf(v) else v or 0.0 for v in rec]
    bars = a5.barh(ys, shown, color=colors)
    for bar, v in zip(bars, rec, strict=True):
        if v is not None and math.isinf(v):
            bar.set_hatch("//")
            bar.set_facecolor("white")
            bar.set_edgecolor(PEER_COLOR)
    for y, v in zip(ys, rec, strict=True):
        if v is None:
            a5.text(0, y, " n/a", va="center", fontsize=8)
        elif math.isinf(v):
            a5.text(
                give_up / 2,
                y,
                f"not run again within {give_up:.0f} s",
                va="center",
                ha="center",
                fontsize=8,
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
            )
        else:
            a5.text(v, y, f" {v:.1f} s", va="center", fontsize=8)
    a5.set_yticks(ys, labels)
    a5.invert_yaxis()
    a5.set_xlim(0, give_up * 1.05)
    a5.set_title(
        "Job runs again after its worker is SIGKILLed\nseconds, default settings, lower is better"
    )

    m = doc["machine"]
    tasks = _value(doc, "queueworks", "throughput_2_tasks", "jobs_per_s")
    per_task = [] if tasks is None else [f"one task per job: {tasks:,.0f} jobs/s on 2 workers"]
    a6.axis("off")
    a6.text(
        0.0,
        0.95,
        "\n".join(
            [
                "one run, one machine",
                doc["date"],
                f"{m['cpu']}",
                f"{m['cores']} cores, {m['memory_gib']} GiB, redis-server {m['redis_server']}",
                f"load avg (1 min): {doc['load_start'][0]:.1f} at start,"
                f" {doc['load_end'][0]:.1f} at end",
                "(shared machine: other test suites were running)",
                "",
                "queueworks: a job is a subtask of one task;",
                *per_task,
                "queueworks queue: q.enqueue(...) once per job",
                "",
                f"command: {doc['command']}",
                "details and method: docs/peers.md",
            ]
        ),
        va="top",
        fontsize=9,
        family="monospace",
        wrap=True,
    )
    for ax in (a1, a2, a3, a4, a5):
        ax.tick_params(axis="y", labelsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    fig.suptitle("queueworks and its peers — same workloads, same machine, same run", fontsize=13)
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
