"""The four PNGs of docs/benchmarks.md, with matplotlib (Agg: no display): throughput bars, the
latency CDF at the fixed rate, the latency-versus-throughput curve and peak memory bars. Every
configuration is named with its durability setting; a FAILED one is drawn hatched and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

FILES = {
    "throughput": "throughput.png",
    "latency_cdf": "latency_cdf.png",
    "latency_curve": "latency_curve.png",
    "memory": "memory.png",
}


def _name(s: dict[str, Any]) -> str:
    return f"{s['label']}{' (FAILED)' if s['failed'] else ''}\n[{s['durability']}]"


def write_all(data: dict[str, Any], directory: Path) -> dict[str, Path]:
    import matplotlib

    matplotlib.use("Agg")
    directory.mkdir(parents=True, exist_ok=True)
    systems = data["systems"]
    title = (
        f"{data['machine']['cores']} cores, {data['date']}{' (QUICK run)' if data['plan']['quick'] else ''}"
    )
    paths = {key: directory / name for key, name in FILES.items()}
    _throughput(systems, title, paths["throughput"])
    _cdf(systems, title, data["plan"]["latency_rate"], paths["latency_cdf"])
    _curve(systems, title, paths["latency_curve"])
    _memory(systems, title, paths["memory"])
    return paths


def _bars(ax: Any, systems: list[dict[str, Any]], series: list[tuple[str, list[float], list[float]]]) -> None:
    width = 0.8 / len(series)
    for i, (label, values, errors) in enumerate(series):
        xs = [x + (i - (len(series) - 1) / 2) * width for x in range(len(systems))]
        bars = ax.barh(xs, values, width, xerr=errors or None, label=label, capsize=2)
        for bar, s in zip(bars, systems, strict=True):
            if s["failed"]:
                bar.set_hatch("//")
                bar.set_alpha(0.4)
    ax.set_yticks(range(len(systems)))
    ax.set_yticklabels([_name(s) for s in systems], fontsize=7)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def _throughput(systems: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.55 * len(systems) + 1.5))
    series = []
    for key, label in (("produce_rps", "produce"), ("consume_rps", "consume")):
        med = [s[key]["median"] for s in systems]
        err = [[m - s[key]["min"] for m, s in zip(med, systems, strict=True)],
               [s[key]["max"] - m for m, s in zip(med, systems, strict=True)]]  # fmt: skip
        series.append((label, med, err))
    _bars(ax, systems, series)  # type: ignore[arg-type]
    ax.set_xlabel("records/s, producer and consumer at the same time (median; bars: min-max)")
    ax.set_title(f"Throughput, 116-byte records\n{title}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _cdf(systems: list[dict[str, Any]], title: str, rate: int, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    for s in systems:
        points = s["latency"].get("latency_cdf_ms") or []
        if not points:
            continue
        ys = [(i + 1) / len(points) for i in range(len(points))]
        ax.plot(points, ys, label=_name(s).replace("\n", " "), linestyle="-" if s["sluice"] else "--")
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency, ms (producer's send -> consumer's receive; log scale)")
    ax.set_ylabel("fraction of records")
    ax.set_title(f"Latency CDF at {rate:,} records/s\n{title}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _curve(systems: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    for s in systems:
        runs = sorted((r for r in s["curve"] if r.get("e2e_ms")), key=lambda r: r["target_rate"])
        if not runs:
            continue
        xs = [r["produce_rps"] for r in runs]
        ys = [r["e2e_ms"].get("p99", 0.0) for r in runs]
        style = "-o" if s["sluice"] else "--s"
        ax.plot(xs, ys, style, label=_name(s).replace("\n", " "), markersize=4)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("achieved records/s (targets: " + ", ".join(
        f"{r:,}" for r in sorted({r["target_rate"] for s in systems for r in s["curve"]})) + ")")  # fmt: skip
    ax.set_ylabel("end-to-end p99, ms (log scale)")
    ax.set_title(f"Latency versus throughput\n{title}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _memory(systems: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(systems) + 1.5))
    _bars(ax, systems, [("peak RSS", [s["peak_rss_mb"] for s in systems], [])])
    ax.set_xlabel("MB: peak of the summed RSS of every server process of the system (sampled every 100 ms)")
    ax.set_title(f"Server memory\n{title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
