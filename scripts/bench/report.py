#!/usr/bin/env python3
"""Turn the raw records of scripts/bench.sh into the Markdown report.

Usage: report.py RECORDS.tsv

RECORDS.tsv has one tab-separated record a line:
  info     KEY  VALUE            machine and run facts, printed in order
  fs       ID   LABEL            a filesystem column, in order (the first is the baseline)
  workload ID   LABEL            a timed row, in order
  time     WL   FS  REP  SECS    one measurement
  fail     WL   FS  REP  WHY     a measurement that failed
  extra    KEY  FS  VALUE        rss_kb, hwm_kb per daemon
  hook     KEY  VALUE            hook latency summary
  lat      FS   REP  P50 P99 MAX request latency of one repetition, µs
  note     TEXT                  a footnote
The report goes to stdout.
"""

import math
import statistics
import sys
from collections import defaultdict


def fmt_secs(v: float) -> str:
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 0.1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_ratio(v: float) -> str:
    return f"{v:.2f}×" if v < 10 else f"{v:.1f}×"


def table(header, rows):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    info, fss, wls, notes, hook = [], [], [], [], []
    lat = defaultdict(list)
    times = defaultdict(list)
    fails = defaultdict(list)
    extra = defaultdict(dict)
    with open(sys.argv[1]) as f:
        for raw in f:
            r = raw.rstrip("\n").split("\t")
            kind = r[0]
            if kind == "info":
                info.append((r[1], r[2]))
            elif kind == "fs":
                fss.append((r[1], r[2]))
            elif kind == "workload":
                wls.append((r[1], r[2]))
            elif kind == "time":
                times[(r[1], r[2])].append(float(r[4]))
            elif kind == "fail":
                fails[(r[1], r[2])].append(r[4])
            elif kind == "extra":
                extra[r[1]][r[2]] = r[3]
            elif kind == "hook":
                hook.append((r[1], r[2]))
            elif kind == "lat":
                lat[r[1]].append(tuple(float(x) for x in r[3:6]))
            elif kind == "note":
                notes.append(r[1])

    base = fss[0][0]
    med = {k: statistics.median(v) for k, v in times.items()}
    out = []
    title = dict(info).get("date", "")
    out.append(f"### Run of {title}\n")
    for k, v in info:
        if k != "date":
            out.append(f"- {k}: {v}")
    out.append("")

    # Ratios.
    header = ["workload", f"{fss[0][1]} (s)"] + [label for _, label in fss[1:]]
    rows = []
    logs = defaultdict(list)
    for wid, wlabel in wls:
        b = med.get((wid, base))
        row = [wlabel, fmt_secs(b) if b is not None else "failed"]
        for fid, _ in fss[1:]:
            m = med.get((wid, fid))
            if m is None or b is None or b <= 0:
                row.append("failed" if fails.get((wid, fid)) else "—")
                continue
            ratio = m / b
            logs[fid].append(math.log(ratio))
            row.append(fmt_ratio(ratio))
        rows.append(row)
    counts = {len(v) for v in logs.values()}
    n = max(counts) if counts else 0
    gm = ["geometric mean" + (f" ({n} metrics)" if len(counts) == 1 else ""), ""]
    for fid, _ in fss[1:]:
        v = logs.get(fid)
        gm.append(fmt_ratio(math.exp(sum(v) / len(v))) + ("" if len(v) == n else f" ({len(v)})") if v else "—")
    rows.append(gm)
    out.append("Ratio = median time / median native time (lower is better):\n")
    out.append(table(header, rows))
    out.append("")

    # Medians with spread.
    header = ["workload"] + [label for _, label in fss]
    rows = []
    for wid, wlabel in wls:
        row = [wlabel]
        for fid, _ in fss:
            v = times.get((wid, fid))
            if not v:
                row.append("failed" if fails.get((wid, fid)) else "—")
            elif len(v) == 1:
                row.append(fmt_secs(v[0]))
            else:
                row.append(f"{fmt_secs(statistics.median(v))} ({fmt_secs(min(v))}–{fmt_secs(max(v))})")
        rows.append(row)
    out.append("Median seconds (min–max over the repetitions):\n")
    out.append(table(header, rows))
    out.append("")

    if extra:
        rows = []
        for fid, label in fss:
            if fid in extra.get("rss_kb", {}):
                rss = int(extra["rss_kb"][fid]) / 1024
                hwm = int(extra.get("hwm_kb", {}).get(fid, "0")) / 1024
                rows.append([label, f"{rss:.1f}", f"{hwm:.1f}"])
        if rows:
            out.append("Daemon memory after the workloads (MiB):\n")
            out.append(table(["filesystem", "VmRSS", "VmHWM (peak)"], rows))
            out.append("")

    if hook:
        out.append("Hook latency (inbox `task-*.md` close() returning → the agent's first instruction):\n")
        out.append(table(["measure", "value"], [[k, v] for k, v in hook]))
        out.append("")

    if lat:
        rows = []
        for fid, label in fss:
            v = lat.get(fid)
            if v:
                rows.append([label] + [f"{statistics.median(x[i] for x in v):.1f}" for i in range(3)])
        out.append("Request latency (a GETATTR round trip, µs; medians over the repetitions):\n")
        out.append(table(["filesystem", "p50", "p99", "max"], rows))
        out.append("")

    for (wid, fid), why in sorted(fails.items()):
        out.append(f"- failed: {wid} on {fid}: {why[0]}")
    for n_ in notes:
        out.append(f"- {n_}")
    print("\n".join(out).rstrip() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
