#!/usr/bin/env python3
"""Renders benchmark CSVs as SVG images for docs/BENCHMARKS.md (standard library only).

  scripts/plot_bench.py cdf REPLICATION_CDF.csv OUT.svg     # from `microrep bench replication --cdf`
  scripts/plot_bench.py failover FAILOVER.csv OUT.svg       # from `microrep bench failover --csv`
"""
import csv
import math
import sys

W, H, L, R, T, B = 720, 420, 70, 20, 30, 50
COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def svg(title, body, xlabel, ylabel):
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">'
        f'<rect width="{W}" height="{H}" fill="white"/>'
        f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{title}</text>'
        f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>'
        f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>'
        f'<text x="{W / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>'
        f'<text x="16" y="{H / 2}" text-anchor="middle" transform="rotate(-90 16 {H / 2})">{ylabel}</text>'
        + body
        + "</svg>\n"
    )


def log_x(v, lo, hi):
    return L + (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)) * (W - L - R)


def cdf(path, out):
    series = {}
    for row in csv.DictReader(open(path)):
        series.setdefault(f"{row['impl']} {row['bytes']} B", []).append((float(row["quantile"]), float(row["ns"])))
    values = [v for s in series.values() for _, v in s]
    lo, hi = 10 ** math.floor(math.log10(min(values))), 10 ** math.ceil(math.log10(max(values)))
    body = ""
    decade = lo
    while decade <= hi:
        x = log_x(decade, lo, hi)
        body += f'<line x1="{x}" y1="{T}" x2="{x}" y2="{H - B}" stroke="#ddd"/>'
        body += f'<text x="{x}" y="{H - B + 16}" text-anchor="middle">{decade / 1000:g} us</text>'
        decade *= 10
    for q in (0, 0.5, 0.9, 0.99, 1):
        y = H - B - q * (H - T - B)
        body += f'<text x="{L - 6}" y="{y + 4}" text-anchor="end">{q:g}</text>'
    for i, (name, points) in enumerate(sorted(series.items())):
        color = COLORS[i % len(COLORS)]
        pts = " ".join(f"{log_x(v, lo, hi):.1f},{H - B - q * (H - T - B):.1f}" for q, v in sorted(points))
        body += f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>'
        body += f'<text x="{W - R - 150}" y="{T + 14 + 16 * i}" fill="{color}">{name}</text>'
    open(out, "w").write(svg("Replication latency CDF (microrep bench replication)", body, "latency (log scale)", "quantile"))


def failover(path, out):
    rows = list(csv.DictReader(open(path)))
    totals = [(int(r["detection_ns"]) + int(r["switch_ns"])) / 1000 for r in rows]
    lo, hi = max(min(totals), 1), max(totals)
    lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
    bins = 40
    edges = [lo * (hi / lo) ** (i / bins) for i in range(bins + 1)]
    counts = {"kill": [0] * bins, "stop": [0] * bins}
    for r, t in zip(rows, totals):
        i = min(bins - 1, max(0, int(math.log(t / lo) / math.log(hi / lo) * bins)))
        counts[r["kind"]][i] += 1
    top = max(max(c) for c in counts.values()) or 1
    body = ""
    decade = lo
    while decade <= hi:
        x = log_x(decade, lo, hi)
        body += f'<text x="{x}" y="{H - B + 16}" text-anchor="middle">{decade:g} us</text>'
        decade *= 10
    for k, (kind, color) in enumerate((("kill", COLORS[0]), ("stop", COLORS[1]))):
        for i, c in enumerate(counts[kind]):
            if c == 0:
                continue
            x0, x1 = log_x(edges[i], lo, hi), log_x(edges[i + 1], lo, hi)
            w = (x1 - x0) / 2
            h = c / top * (H - T - B)
            body += f'<rect x="{x0 + k * w:.1f}" y="{H - B - h:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{color}"/>'
        body += f'<text x="{W - R - 200}" y="{T + 14 + 16 * k}" fill="{color}">leader {kind} ({sum(counts[kind])})</text>'
    body += f'<text x="{L - 6}" y="{T + 4}" text-anchor="end">{top}</text>'
    open(out, "w").write(svg("Fail-over time, failure to first commit (microrep bench failover)", body, "time (log scale)", "failures"))


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("cdf", "failover"):
        sys.exit(__doc__)
    {"cdf": cdf, "failover": failover}[sys.argv[1]](sys.argv[2], sys.argv[3])
