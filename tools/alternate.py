#!/usr/bin/env python3
"""Two builds' figure, alternated: the way to compare a kernel change on a noisy host.

    tools/alternate.py [--rounds 12] [--figure REGEX] 'COMMAND A' 'COMMAND B'

Runs A and B in turn (A B, then B A, and so on, so that a drift in the host's speed
falls on both), takes from each run's output the last match of REGEX's first group
(default: `forward_rows`' "median X ms"), and prints each command's median and the
median of the per-pair ratios B / A with their spread. Below 1 means B takes less of
whatever the figure measures. Example, a one-row step of the Q8_0 model, the build
before a change against the build after it:

    tools/alternate.py 'old/forward_rows M.gguf 1 150 64' 'new/forward_rows M.gguf 1 150 64'
"""
import argparse
import re
import shlex
import statistics
import subprocess
import sys


def figure(command, pattern):
    run = subprocess.run(shlex.split(command), capture_output=True, text=True)
    found = re.findall(pattern, run.stdout + run.stderr)
    if run.returncode != 0 or not found:
        sys.exit(f"{command!r} exited {run.returncode} or printed no {pattern!r}:\n"
                 f"{run.stderr[-2000:]}")
    return float(found[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--figure", default=r"median ([0-9.]+)")
    args = ap.parse_args()
    a, b, ratios = [], [], []
    for round_ in range(args.rounds):
        if round_ % 2 == 0:
            x = figure(args.a, args.figure)
            y = figure(args.b, args.figure)
        else:
            y = figure(args.b, args.figure)
            x = figure(args.a, args.figure)
        a.append(x)
        b.append(y)
        ratios.append(y / x)
    ratios.sort()
    print(f"A median {statistics.median(a):.4g}, B median {statistics.median(b):.4g}, "
          f"B/A median of {args.rounds} pairs {statistics.median(ratios):.3f} "
          f"(from {ratios[0]:.3f} to {ratios[-1]:.3f})")


if __name__ == "__main__":
    main()
