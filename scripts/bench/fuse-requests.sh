#!/usr/bin/env bash
# Count the FUSE requests the kernel sends to one mount while a command runs (issue 14), by
# opcode, from the kernel tracepoint fuse:fuse_request_send filtered to that mount's connection.
#
# Usage: scripts/bench/fuse-requests.sh MOUNT -- CMD [ARGS...]
#
# Prints "count OPCODE" lines (most frequent first) and a "total" line on stdout; CMD's own
# output goes to stderr. Root only. Uses a private tracefs instance (instances/fuse-requests-PID),
# so it neither reads nor disturbs anyone else's tracing; tracefs is mounted in a temp dir when it
# is not mounted yet, and everything made here is removed on exit.
set -euo pipefail
me="fuse-requests.sh"
die() { echo "$me: error: $*" >&2; exit 2; }
[ $# -ge 3 ] && [ "$2" = "--" ] || die "usage: $me MOUNT -- CMD [ARGS...]"
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
echo "connection == $(((major << 20) | minor))" >"$ev/filter"
echo 16384 >"$inst/buffer_size_kb"
: >"$inst/trace"
echo 1 >"$ev/enable"
"$@" >&2
echo 0 >"$ev/enable"
sed -nE 's/.* opcode [0-9]+ \((FUSE_[A-Z_]+)\).*/\1/p' "$inst/trace" | sort | uniq -c | sort -rn
sed -nE 's/.* opcode [0-9]+ \((FUSE_[A-Z_]+)\).*/\1/p' "$inst/trace" | wc -l | sed 's/^/total /'
if grep -q 'LOST' "$inst/trace"; then echo "$me: warning: events were lost (buffer full)" >&2; fi
