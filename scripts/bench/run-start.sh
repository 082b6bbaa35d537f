#!/usr/bin/env bash
# The cost of a run start (docs/PERFORMANCE.md "Run start"): a fresh mount whose agent is
# `fsops stamp FILE` (its first instruction writes CLOCK_REALTIME); for each of N inbox tasks, the
# time from the task file's close() (`fsops inbox`) to the stamp. Prints samples, p50, p99, max.
#
# Usage: scripts/bench/run-start.sh [--sandbox] [--identity MODE] [-n N]
#   --sandbox   runs start in the sandbox (docs/SPEC.md §12, the default); without it the mount
#               has `"sandbox": {"enabled": false}`
#   --identity  cgroup or ancestry (default: the mount's default)
#   -n N        samples (default 200)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
SMITHFS="${SMITHFS:-$root/target/release/smithfs}"
n=200 sandbox=0 identity=()
while [ $# -gt 0 ]; do
    case "$1" in
        --sandbox) sandbox=1; shift ;;
        --identity) identity=(--identity "${2:?}"); shift 2 ;;
        -n) n="${2:?}"; shift 2 ;;
        *) echo "usage: $0 [--sandbox] [--identity MODE] [-n N]" >&2; exit 2 ;;
    esac
done
T="$(mktemp -d /tmp/smithfs-runstart-XXXXXX)"
chmod 755 "$T"
fsops="$T/fsops"
gcc -O2 -Wall -o "$fsops" "$here/fsops.c"
out="$T/out"
mkdir -m 1777 "$out"
d="$T/m"
cleanup() { "$SMITHFS" umount "$d" >/dev/null 2>&1 || true; rm -rf "$T"; }
trap cleanup EXIT
"$SMITHFS" init "$d" >/dev/null
python3 - "$d/config.json" "$fsops" "$out/stamp" "$out" "$sandbox" <<'PY'
import json, sys
path, fsops, stamp, out, _ = sys.argv[1:]
c = json.load(open(path))
c.setdefault("agent", {}).update({"command": [fsops, "stamp", stamp], "retries": 0, "timeout_secs": 60})
c["sandbox"] = {"writable": [out], "enabled": sys.argv[5] == "1"}
json.dump(c, open(path, "w"), indent=2)
PY
"$SMITHFS" mount "$d" --allow-other "${identity[@]}"
lat=()
for ((i = 1; i <= n; i++)); do
    rm -f "$out/stamp"
    t0="$("$fsops" inbox "$d/smiths/smith-root/inbox/task-$(printf %04d "$i").md")"
    deadline=$((SECONDS + 10))
    while [ ! -s "$out/stamp" ] && [ $SECONDS -lt $deadline ]; do sleep 0.002; done
    [ -s "$out/stamp" ] || { echo "no run started within 10 s (task $i)" >&2; break; }
    lat+=("$(($(cat "$out/stamp") - t0))")
    # The run exits at once: wait until the smith is no longer running before the next task.
    for _ in $(seq 500); do
        "$SMITHFS" status "$d" | grep -q '^smith-root  running' || break
        sleep 0.01
    done
done
printf '%s\n' "${lat[@]}" | sort -n | awk -v n="${#lat[@]}" -v sb="$sandbox" '
    { v[NR] = $1 / 1e6 }
    END {
        printf "sandbox %s: samples %d, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", sb ? "on" : "off", n,
            v[int((n - 1) * 0.50) + 1], v[int((n - 1) * 0.99) + 1], v[n]
    }'
