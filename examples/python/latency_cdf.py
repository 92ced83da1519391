#!/usr/bin/env python3
"""Measures microrep's propose latency from Python and plots its CDF.

A local cluster of three replicas of a trivial state machine (it echoes each command) runs in
this process on the shm fabric; one thread proposes COUNT commands one after another through
the leader and times each with time.perf_counter_ns. Prints percentiles and writes a PNG of
the cumulative distribution (matplotlib; `pip install matplotlib`).

    python3 examples/python/latency_cdf.py --count 20000 --out latency_cdf.png
    python3 examples/python/latency_cdf.py --mode direct --no-plot

The latency includes the Python call, the GIL's release and reacquisition, and the replicas'
calls into Python to apply the command: it is an upper bound of what microrep itself adds.
"""

import argparse
import sys
import time

import microrep


class Echo:
    """Replies with the command; keeps only a count as its state."""

    def __init__(self):
        self.applied = 0

    def apply(self, index, command):
        self.applied += 1
        return command

    def snapshot(self):
        return self.applied.to_bytes(8, "little")

    def restore(self, snapshot):
        self.applied = int.from_bytes(snapshot, "little")


def measure(count, mode, size):
    """Returns `count` propose latencies in microseconds, in the order measured, and how many
    proposals a leader change disrupted (not timed: each is retried through the new leader)."""
    settings = {"cluster.timing.heartbeat_us": 5000, "node.mode": mode}
    with microrep.LocalCluster(Echo, replicas=3, settings=settings) as cluster:
        command = b"x" * size
        cluster.propose(command)  # waits for a leader
        leader = cluster.nodes[leader_id(cluster)]
        latencies, disrupted = [], 0
        warmup = min(count, 1000)  # warms caches and the allocator; not recorded
        while len(latencies) < count + warmup:
            start = time.perf_counter_ns()
            try:
                leader.propose(command)
            except (microrep.NotLeaderError, microrep.OutcomeUnknownError):
                disrupted += 1
                cluster.propose(command)
                leader = cluster.nodes[leader_id(cluster)]
                continue
            latencies.append((time.perf_counter_ns() - start) / 1000)
        return latencies[warmup:], disrupted


def leader_id(cluster):
    """The replica that believes it leads (0 if none does)."""
    return next((n.id for n in cluster.nodes if not n.closed and n.leader == n.id), 0)


def percentile(ordered, p):
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


def plot(ordered, path, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    fractions = [(i + 1) / len(ordered) for i in range(len(ordered))]
    ax.step(ordered, fractions, where="post")
    ax.set_xscale("log")
    ax.set_xlabel("propose latency (µs, log scale)")
    ax.set_ylabel("fraction of proposals")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    for p in (50, 99):
        x = percentile(ordered, p)
        ax.axvline(x, linestyle="--", alpha=0.5)
        ax.annotate(f"p{p} {x:.3g} µs", (x, p / 100), textcoords="offset points", xytext=(5, -12))
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=5000, help="proposals to time (default 5000)")
    parser.add_argument("--mode", choices=["handover", "direct"], default="handover")
    parser.add_argument("--size", type=int, default=16, help="command bytes (default 16)")
    parser.add_argument("--out", default="latency_cdf.png", help="the PNG to write")
    parser.add_argument("--no-plot", action="store_true", help="print percentiles only")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be positive")

    latencies, disrupted = measure(args.count, args.mode, args.size)
    ordered = sorted(latencies)
    summary = "  ".join(f"p{p} {percentile(ordered, p):.1f}" for p in (50, 90, 99, 99.9))
    print(f"{args.count} proposals ({args.mode} mode, {args.size} B), µs: {summary}  max {ordered[-1]:.1f}")
    if disrupted:
        print(f"{disrupted} proposals were disrupted by a leader change (retried, not timed)")
    if not args.no_plot:
        title = f"microrep propose from Python\n3 replicas on shm, {args.mode} mode, {args.count} proposals"
        plot(ordered, args.out, title)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
