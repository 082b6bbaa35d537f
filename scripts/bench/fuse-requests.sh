#!/usr/bin/env bash
# Count the FUSE requests the kernel sends to one mount while a command runs (issue 14), by
# opcode, from the kernel tracepoint fuse:fuse_request_send filtered to that mount's connection.
#
# Usage: scripts/bench/fuse-requests.sh [--latency] MOUNT -- CMD [ARGS...]
#
# Prints "count OPCODE" lines (most frequent first) and a "total" line on stdout; CMD's own
# output goes to stderr. With --latency it also traces fuse:fuse_request_end and prints, per
# opcode, how long the kernel waited for the daemon's answer (send to end: the queue, the
# daemon's work and the hand-back): count, mean, p50, p90, p99 and max in µs, and the total time. Root only. Uses a private tracefs instance (instances/fuse-requests-PID),
# so it neither reads nor disturbs anyone else's tracing; tracefs is mounted in a temp dir when it
# is not mounted yet, and everything made here is removed on exit.
set -euo pipefail
me="fuse-requests.sh"
die() { echo "$me: error: $*" >&2; exit 2; }
latency=0
if [ "${1:-}" = --latency ]; then latency=1; shift; fi
[ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: $me [--latency] MOUNT -- CMD [ARGS...]"
mnt="$1"
shift 2
[ "$(id -u)" = 0 ] || die "needs root (tracefs)"
mountpoint -q "$mnt" || die "$mnt is not a mount point"

tracing="$(awk '$3 == "tracefs" { print $2; exit }' /proc/self/mounts)"
own_mount=""
if [ -z "$tracing" ]; then
    own_mount="$(mktemp -d /tmp/fuse-requests-tracefs.XXXXXX)"
    mount -t tracefs nodev "$own_mount" || die "cannot mount tracefs"
    tracing="$own_mount"
fi
inst="$tracing/instances/fuse-requests-$$"
cleanup() {
    [ -d "$inst" ] && { echo 0 >"$inst/events/fuse/fuse_request_send/enable" || true; rmdir "$inst" || true; }
    if [ -n "$own_mount" ]; then umount "$own_mount" || true; rmdir "$own_mount" || true; fi
}
trap cleanup EXIT
mkdir "$inst" || die "cannot make a tracefs instance"
ev="$inst/events/fuse/fuse_request_send"
[ -d "$ev" ] || die "no fuse:fuse_request_send tracepoint (fuse not loaded?)"
# The tracepoint's connection is the superblock's kernel dev_t: major << 20 | minor.
read -r major minor < <(stat -c '%Hd %Ld' "$mnt")
end="$inst/events/fuse/fuse_request_end"
echo "connection == $(((major << 20) | minor))" >"$ev/filter"
[ $latency = 0 ] || echo "connection == $(((major << 20) | minor))" >"$end/filter"
echo 65536 >"$inst/buffer_size_kb"
: >"$inst/trace"
echo 1 >"$ev/enable"
[ $latency = 0 ] || echo 1 >"$end/enable"
"$@" >&2
echo 0 >"$ev/enable"
[ $latency = 0 ] || echo 0 >"$end/enable"
sed -nE 's/.* opcode [0-9]+ \((FUSE_[A-Z_]+)\).*/\1/p' "$inst/trace" | sort | uniq -c | sort -rn
sed -nE 's/.* opcode [0-9]+ \((FUSE_[A-Z_]+)\).*/\1/p' "$inst/trace" | wc -l | sed 's/^/total /'
if [ $latency = 1 ]; then
    python3 - "$inst/trace" <<'PY'
import re, sys
sent, lat = {}, {}
for line in open(sys.argv[1]):
    m = re.search(r" ([0-9]+\.[0-9]+): fuse_request_(send|end): .* req ([0-9]+)", line)
    if not m:
        continue
    t, kind, req = float(m[1]), m[2], m[3]
    if kind == "send":
        op = re.search(r"\((FUSE_[A-Z_]+)\)", line)
        sent[req] = (t, op[1] if op else "?")
    elif req in sent:
        t0, op = sent.pop(req)
        lat.setdefault(op, []).append((t - t0) * 1e6)
rows = sorted(lat.items(), key=lambda kv: -sum(kv[1]))
print(f"{'opcode':<20} {'count':>7} {'mean µs':>9} {'p50 µs':>8} {'p90 µs':>8} {'p99 µs':>8} {'max µs':>9} {'total ms':>9}")
for op, v in rows:
    v.sort()
    print(f"{op:<20} {len(v):>7} {sum(v)/len(v):>9.1f} {v[len(v)//2]:>8.1f} {v[len(v)*9//10]:>8.1f} {v[len(v)*99//100]:>8.1f} {v[-1]:>9.1f} {sum(v)/1e3:>9.1f}")
PY
fi
if grep -q 'LOST' "$inst/trace"; then echo "$me: warning: events were lost (buffer full)" >&2; fi
