#!/usr/bin/env python3
"""Step-to-step intervals of a decode run, from bench/kernel_timeline.cpp's CSV: where the
GPU waited between steps (a host stall, a capture, a copy), not where a step spends its time
(timeline.py).

usage: step_gaps.py TIMELINE.csv FIRST_KERNEL [--first N]

The steps start with FIRST_KERNEL; only the first N (default: all) of them are used — e.g.
the b1 round of a bench that runs several batch sizes, whose later rounds start differently.
Printed: the intervals' percentiles, then the ten longest with the gap before the step (the
idle time between the previous kernel's end and this step's first start) and the kernels
(or copies) in it.
"""
import statistics
import sys


def main():
    path, first = sys.argv[1], sys.argv[2]
    limit = int(sys.argv[sys.argv.index("--first") + 1]) if "--first" in sys.argv else None
    rows = []
    with open(path) as f:
        for line in f:
            s, e, n = line.rstrip("\n").split(",", 2)
            rows.append((int(s), int(e), n))
    rows.sort()
    starts = [i for i, r in enumerate(rows) if r[2] == first][:limit]
    if len(starts) < 3:
        sys.exit(f"{first} occurs {len(starts)} times")
    iv = [((rows[b][0] - rows[a][0]) / 1e3, a, b) for a, b in zip(starts, starts[1:])]
    v = sorted(x[0] for x in iv)
    q = lambda p: v[min(len(v) - 1, int(p * len(v)))]
    print(f"{len(v)} step intervals (us): median {statistics.median(v):.1f}, p10 {q(0.1):.1f}, p90 {q(0.9):.1f}, max {v[-1]:.1f}, mean {statistics.mean(v):.1f}, sum {sum(v):.0f}")
    for t, a, b in sorted(iv, reverse=True)[:10]:
        gap = (rows[a][0] - max(r[1] for r in rows[max(0, a - 8):a])) / 1e3 if a > 0 else 0.0
        names = sorted({r[2] for r in rows[a:b] if not r[2].startswith(("rms_", "o576", "swiglu", "qkv"))})
        print(f"  {t:8.1f} us at step {starts.index(a)}: idle before it {gap:.1f} us; {b - a} records, besides the layers: {', '.join(n[:40] for n in names)[:300]}")


if __name__ == "__main__":
    main()
