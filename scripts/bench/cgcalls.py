#!/usr/bin/env python3
"""Per-request instruction counts from a callgrind profile of a FUSE daemon.

Usage: cgcalls.py CALLGRIND.OUT [REGEX]

Sums, over all callers, the calls made to and the inclusive instructions spent in every function
whose name matches REGEX (default: smithfs's one dispatcher, `fuse::dispatch::Dispatcher::dispatch`,
called once per request since fuser's adapter went (notes U14), and libfuse's lowlevel op
handlers `lo_*`), and prints calls, inclusive
instructions and instructions per call, biggest first.
"""

import re
import sys
from collections import defaultdict

DEFAULT = r"smithfs::fuse::dispatch::Dispatcher::dispatch|^lo_[a-z_]+$|^fuse_session_process_buf_int$"


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    pat = re.compile(sys.argv[2] if len(sys.argv) == 3 else DEFAULT)
    names = {}
    calls = defaultdict(int)
    incl = defaultdict(int)
    cfn = None
    pending = None
    with open(sys.argv[1], errors="replace") as f:
        for line in f:
            if line.startswith("cfn="):
                m = re.match(r"cfn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m.group(2):
                    names[m.group(1)] = m.group(2)
                cfn = m.group(1)
            elif line.startswith("fn="):
                m = re.match(r"fn=\((\d+)\)(?: (.*))?", line.rstrip("\n"))
                if m and m.group(2):
                    names[m.group(1)] = m.group(2)
            elif line.startswith("calls="):
                pending = (cfn, int(line.split()[0][6:]))
            elif pending is not None:
                # The line after calls= holds the call's position and its inclusive cost.
                parts = line.split()
                if len(parts) >= 2:
                    fid, n = pending
                    calls[fid] += n
                    incl[fid] += int(parts[1])
                pending = None
    rows = []
    for fid, n in calls.items():
        name = names.get(fid, fid)
        if pat.search(name):
            rows.append((incl[fid], n, name))
    rows.sort(reverse=True)
    print(f"{'calls':>9} {'instructions':>14} {'per call':>9}  function")
    for ins, n, name in rows:
        print(f"{n:>9} {ins:>14} {ins // max(n, 1):>9}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
