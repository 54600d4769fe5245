#!/usr/bin/env python3
"""Sum an `ncu --csv --metrics gpu__time_duration.sum` log by kernel: launches, total and
mean device time, and the time per decoding step (a step launches MARKER once: by
default `embed_rows`, the device kernels' first; `fast_argmax` for candle's path).

    python3 tools/ncu-summary.py ncu.csv [MARKER]
"""
import csv
import sys
from collections import defaultdict

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head, body = rows[0], rows[1:]
name_at, value_at, unit_at = head.index("Kernel Name"), head.index("Metric Value"), head.index("Metric Unit")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
by = defaultdict(lambda: [0, 0.0])
for r in body:
    name = r[name_at].split("(")[0].split("<")[0].strip()
    by[name][0] += 1
    by[name][1] += float(r[value_at].replace(",", "")) * scale.get(r[unit_at], 1.0)
marker = sys.argv[2] if len(sys.argv) > 2 else "embed_rows"
steps = max(next((v[0] for k, v in by.items() if k.startswith(marker)), 1), 1)
total = sum(v[1] for v in by.values())
print(f"{sum(v[0] for v in by.values())} launches over {steps} steps: {total / steps:.1f} us of kernels per step")
for name, (n, us) in sorted(by.items(), key=lambda kv: -kv[1][1]):
    print(f"  {name}: {n / steps:.0f} per step, {us / n:.2f} us each, {us / steps:.1f} us per step")
