#!/usr/bin/env bash
# Count the instructions a FUSE daemon spends per request, under callgrind (issue 5: "passthrough_hp
# spends about 1 550 instructions per FUSE request — compare").
#
# Usage: scripts/bench/profile.sh [--fs smithfs|nopt|pll|bindfs] [--smith] [--n N] [--out DIR] WORKLOAD...
#
#   --smith     run the workloads bound to smith-root (`smithfs run --smith smith-root`)
#   --fs F      the daemon to profile (default smithfs; nopt = smithfs --no-passthrough)
#   --n N       files per workload (default 2000)
#   --out DIR   where callgrind.out and the annotations go (default target/bench/profile-F)
#   WORKLOAD    create (create+write 4 KiB+close), stat (cold lstat), read (cold open+read+close),
#               untar (the bench tree), rm (rm -rf of it); default: create stat read
#
# The daemon runs in the foreground under `valgrind --tool=callgrind`, the workloads run
# natively against its mount, then it is unmounted (by a trap, also on failure) and
# callgrind_annotate prints the functions by inclusive and exclusive instruction counts.
# The number of FUSE requests is counted with strace-free means: the kernel's per-connection
# counter is not exported, so the script reads the daemon's dispatch calls from callgrind
# (calls to smithfs's dispatcher, `fuse::dispatch::Dispatcher::dispatch`, or libfuse's
# fuse_session_process_buf).
# Must run as root. Needs the binaries built by scripts/bench.sh (fsops, passthrough_ll).
set -euo pipefail

me="profile.sh"
die() {
    echo "$me: error: $*" >&2
    exit 2
}
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bench_dir="$repo_root/target/bench"
fs=smithfs
smith=0
n=2000
out=""
workloads=()
while [ $# -gt 0 ]; do
    case "$1" in
        --fs) fs="${2:?}"; shift 2 ;;
        --n) n="${2:?}"; shift 2 ;;
        --smith) smith=1; shift ;;
        --out) out="${2:?}"; shift 2 ;;
        -h | --help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
        -*) die "unknown option $1" ;;
        *) workloads+=("$1"); shift ;;
    esac
done
[ ${#workloads[@]} -gt 0 ] || workloads=(create stat read)
[ "$(id -u)" = 0 ] || die "must run as root"
command -v valgrind >/dev/null || die "valgrind is not installed"
SMITHFS="${SMITHFS:-${CARGO_TARGET_DIR:-$repo_root/target}/release/smithfs}"
fsops="$bench_dir/fsops"
[ -x "$fsops" ] || gcc -O2 -o "$fsops" "$repo_root/scripts/bench/fsops.c"
out="${out:-$bench_dir/profile-$fs}"
mkdir -p "$out"
rm -f "$out"/callgrind.out*

T="$(mktemp -d /var/tmp/smithfs-profile.XXXXXX)"
mnt=""
vg_pid=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$mnt" ] && mountpoint -q "$mnt"; then
        case $fs in
            smithfs | nopt) "$SMITHFS" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" ;;
            *) umount "$mnt" || umount -l "$mnt" ;;
        esac
    fi
    if [ -n "$vg_pid" ]; then
        for _ in $(seq 100); do kill -0 "$vg_pid" 2>/dev/null || break; sleep 0.2; done
        kill -0 "$vg_pid" 2>/dev/null && kill "$vg_pid"
    fi
    grep -q " $T" /proc/self/mounts || rm -rf "$T"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

vg=(valgrind --tool=callgrind --callgrind-out-file="$out/callgrind.out" --trace-children=no)
# valgrind 3.19 does not know openat2 (smithfs resolves every name with it): preload a shim.
shim="$bench_dir/openat2-shim.so"
if [ ! -f "$shim" ] || [ "$repo_root/scripts/bench/openat2-shim.c" -nt "$shim" ]; then
    gcc -O2 -shared -fPIC -o "$shim" "$repo_root/scripts/bench/openat2-shim.c" || die "cannot build the shim"
fi
case $fs in
    smithfs | nopt)
        [ -x "$SMITHFS" ] || die "no smithfs at $SMITHFS"
        "$SMITHFS" init "$T/m" >/dev/null
        mnt="$T/m"
        work="$mnt/smiths/smith-root/private/w"
        opts=()
        [ "$fs" = nopt ] && opts=(--no-passthrough)
        LD_PRELOAD="$shim" "${vg[@]}" "$SMITHFS" mount -f "$mnt" "${opts[@]}" --log-level warn 2>"$out/valgrind.log" &
        ;;
    pll)
        [ -x "$bench_dir/passthrough_ll" ] || die "run scripts/bench.sh first (it builds passthrough_ll)"
        mkdir -p "$T/src/w" "$T/m"
        mnt="$T/m"
        work="$mnt/w"
        "${vg[@]}" "$bench_dir/passthrough_ll" -f -o "source=$T/src" "$mnt" 2>"$out/valgrind.log" &
        ;;
    bindfs)
        mkdir -p "$T/src/w" "$T/m"
        mnt="$T/m"
        work="$mnt/w"
        "${vg[@]}" bindfs -f "$T/src" "$mnt" 2>"$out/valgrind.log" &
        ;;
    *) die "unknown filesystem $fs" ;;
esac
vg_pid=$!
for _ in $(seq 300); do
    if grep -q " $mnt fuse" /proc/self/mounts; then break; fi
    kill -0 "$vg_pid" 2>/dev/null || die "the daemon exited (see $out/valgrind.log)"
    sleep 0.1
done
grep -q " $mnt fuse" /proc/self/mounts || die "no mount after 30 s"
mkdir -p "$work"

settle() { sync; echo 3 >/proc/sys/vm/drop_caches; }
if [ $smith = 1 ]; then
    fsops_real="$fsops"
    fsops() { "$SMITHFS" run --mount "$mnt" --smith smith-root -- "$fsops_real" "$@"; }
    fsops=fsops
fi
for w in "${workloads[@]}"; do
    case $w in
        create) settle; t="$("$fsops" create "$work/small" "$n" 4096)" ;;
        stat) settle; t="$("$fsops" stat "$work/small" "$n")" ;;
        read) settle; t="$("$fsops" read "$work/small" "$n")" ;;
        untar)
            mkdir -p "$work/tree"
            t="$("$fsops" time tar -xf "$(find "$bench_dir" -maxdepth 1 -name "tree-*.tar" | sed -n 1p)" -C "$work/tree")"
            ;;
        rm) t="$("$fsops" time rm -rf "$work/tree")" ;;
        *) die "unknown workload $w" ;;
    esac
    echo "$me: $w: $t s (under valgrind)" >&2
done

case $fs in
    smithfs | nopt) "$SMITHFS" umount "$mnt" ;;
    *) umount "$mnt" ;;
esac
for _ in $(seq 300); do kill -0 "$vg_pid" 2>/dev/null || break; sleep 0.2; done
vg_pid=""
f="$out/callgrind.out"
[ -s "$f" ] || die "no callgrind output (see $out/valgrind.log)"
callgrind_annotate --inclusive=yes "$f" >"$out/inclusive.txt" 2>/dev/null
callgrind_annotate "$f" >"$out/exclusive.txt" 2>/dev/null
total="$(awk '/^summary:|^events:/ {} /PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}' "$out/exclusive.txt")"
# Requests: calls of the per-request dispatcher.
reqs="$(grep -E "smithfs::fuse::dispatch::Dispatcher::dispatch|fuse_session_process_buf_int" "$out/inclusive.txt" |
    head -1 || true)"
echo "$me: total instructions: $total"
echo "$me: dispatcher line (inclusive): ${reqs:-not found}"
echo "$me: annotations: $out/inclusive.txt $out/exclusive.txt"
head -60 "$out/inclusive.txt"
