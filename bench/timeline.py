#!/usr/bin/env python3
"""Each kernel's share of a decode step, from bench/kernel_timeline.cpp's CSV.

usage: timeline.py TIMELINE.csv FIRST_KERNEL [--json OUT]

The steps are the runs of kernels that start with FIRST_KERNEL (e.g. gather_d576_f32, the
embedding gather every step starts with) and are as long as the most common such run; the
last 100 of them are used (the CUDA graph replays). Per kernel position in the step: `cost` =
its end - the previous kernel's end (the time the step's chain spends on it: under PDL a
kernel starts early and waits, so its own start-to-end time overstates it; the step's first
kernel's cost includes the seam from the step before), `span` = its own
end - start. Printed: per kernel name, launches per step and the median cost and span, the
sum, and the step's median length.
"""
import collections
import json
import statistics
import sys


def main():
    path, first = sys.argv[1], sys.argv[2]
    out = sys.argv[sys.argv.index("--json") + 1] if "--json" in sys.argv else None
    rows = []
    with open(path) as f:
        for line in f:
            s, e, n = line.rstrip("\n").split(",", 2)
            rows.append((int(s), int(e), n))
    starts = [i for i, r in enumerate(rows) if r[2] == first]
    runs = [(a, b) for a, b in zip(starts, starts[1:])]
    if not runs:
        sys.exit(f"no steps: {first} occurs {len(starts)} times")
    common = collections.Counter(b - a for a, b in runs).most_common(1)[0][0]
    steps = [(a, b) for a, b in runs if b - a == common][-100:]
    names = [rows[i][2] for i in range(steps[0][0], steps[0][1])]
    cost = collections.defaultdict(list)
    span = collections.defaultdict(list)
    lengths = []
    for a, b in steps:
        if [rows[i][2] for i in range(a, b)] != names:
            continue
        lengths.append((rows[b - 1][1] - rows[a][0]) / 1e3)
        for k, i in enumerate(range(a, b)):
            prev_end = rows[i - 1][1] if i > 0 else rows[i][0]
            cost[k].append((rows[i][1] - prev_end) / 1e3)
            span[k].append((rows[i][1] - rows[i][0]) / 1e3)
    by = collections.OrderedDict()
    for k, n in enumerate(names):
        c, s = statistics.median(cost[k]), statistics.median(span[k])
        d = by.setdefault(n, {"launches": 0, "cost_us": 0.0, "span_us": 0.0})
        d["launches"] += 1
        d["cost_us"] += c
        d["span_us"] += s
    total = sum(d["cost_us"] for d in by.values())
    print(f"{len(lengths)} steps of {common} kernels; step median {statistics.median(lengths):.1f} us (first start to last end); sum of median costs {total:.1f} us")
    print(f"{'kernel':<60} {'per step':>8} {'cost us':>9} {'each':>7} {'span each':>9}")
    for n, d in sorted(by.items(), key=lambda kv: -kv[1]["cost_us"]):
        print(f"{n[:60]:<60} {d['launches']:>8} {d['cost_us']:>9.1f} {d['cost_us'] / d['launches']:>7.2f} {d['span_us'] / d['launches']:>9.2f}")
    print("the step in order, first and last kernels (median cost / span us):")
    for k, n in list(enumerate(names))[:7] + [(None, "...")] + list(enumerate(names))[-5:]:
        if k is None:
            print("  ...")
            continue
        print(f"  {k:>3} {n[:60]:<60} {statistics.median(cost[k]):7.2f} {statistics.median(span[k]):7.2f}")
    if out:
        json.dump({"steps": len(lengths), "kernels_per_step": common, "step_median_us": statistics.median(lengths), "kernels": by}, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
