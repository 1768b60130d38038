"""The cost of gpuflame on one running process, from interleaved windows (scripts/gpu-cost.sh):

    python3 ab_windows.py TICKS MARKS SETTLE_S

TICKS: `tick TIME_NS DONE` lines of scripts/gpu_cost.py; MARKS: `bare|attached START_NS END_NS`
lines, in order, alternating. Each window's rate is DONE over time between its first and last tick
inside [START + SETTLE_S, END - 0.1 s] (SETTLE_S leaves out gpuflame's attach, tables and hooks;
bare windows drop the same, so that both measure the same stretch of a window). Each attached
window is set against the mean of the bare windows on either side of it, so that a drift of the
process's own speed cancels. Prints the slowdown per pair, its median, and a 95% interval of the
median (bootstrap over pairs, 10,000 draws, fixed seed): `slowdown_pct_median=…`,
`slowdown_pct_ci95=LOW,HIGH`, `pairs=N`."""
import random
import statistics
import sys


def rate(ticks, start, end):
    inside = [(t, d) for t, d in ticks if start <= t <= end]
    if len(inside) < 3 or inside[-1][0] == inside[0][0]:
        return None
    (t0, d0), (t1, d1) = inside[0], inside[-1]
    return (d1 - d0) / ((t1 - t0) / 1e9)


def main():
    ticks = [(int(f[1]), int(f[2])) for f in (l.split() for l in open(sys.argv[1])) if len(f) == 3 and f[0] == "tick"]
    marks = [(f[0], int(f[1]), int(f[2])) for f in (l.split() for l in open(sys.argv[2])) if len(f) == 3]
    settle = float(sys.argv[3]) * 1e9
    windows = [(kind, rate(ticks, start + settle, end - 1e8)) for kind, start, end in marks]
    slowdowns = []
    for i, (kind, r) in enumerate(windows):
        if kind != "attached" or r is None:
            continue
        around = [windows[j][1] for j in (i - 1, i + 1) if 0 <= j < len(windows) and windows[j][0] == "bare" and windows[j][1]]
        if not around:
            continue
        base = statistics.mean(around)
        slowdowns.append(100.0 * (base / r - 1.0))
        print(f"pair {len(slowdowns)}: bare {base:.1f}/s, attached {r:.1f}/s, slowdown {slowdowns[-1]:+.2f}%")
    if not slowdowns:
        print("pairs=0")
        return
    rng = random.Random(1)
    medians = sorted(statistics.median(rng.choices(slowdowns, k=len(slowdowns))) for _ in range(10000))
    low, high = medians[249], medians[9749]
    print(f"pairs={len(slowdowns)}")
    print(f"slowdown_pct_median={statistics.median(slowdowns):.2f}")
    print(f"slowdown_pct_ci95={low:.2f},{high:.2f}")
    print(f"ci95_width_points={high - low:.2f}")


if __name__ == "__main__":
    main()
