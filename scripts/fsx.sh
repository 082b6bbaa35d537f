#!/usr/bin/env bash
# Data integrity under stress (issue 6): the crates.io `fsx` (file system exerciser) in parallel
# from 4 smiths' private/ dirs of one smithfs mount, each bound with `smithfs run`; 0
# corruptions allowed (fsx verifies every read against its model and exits non-zero on the
# first mismatch).
#
#   scripts/fsx.sh                  short: 20 000 operations in all (CI, a few seconds)
#   SMITHFS_LONG=1 scripts/fsx.sh   long: 1 000 000 operations in all
#
# Environment:
#   FSX_OPS=N           operations in all (split over the instances), overrides the above
#   FSX_INSTANCES=N     parallel instances, one smith each (default 4, at most 5)
#   FSX_SEED=N          base seed (instance i uses N+i; default: random, printed)
#   FSX_MOUNT_ARGS=...  extra `smithfs mount` arguments, e.g. --no-passthrough
#   FSX_CLOSE_OPEN=N    weight of fsx's close/reopen (default 2). fsx 0.3.2 keeps its mmap
#                       mappings, and without passthrough each one pins the handle it was
#                       made through; a smith may hold limits.max_open_files_per_smith
#                       handles (915 with a 20 000 descriptor limit), so a long
#                       --no-passthrough run with reopens ends with EMFILE (see
#                       docs/RELIABILITY.md); use FSX_CLOSE_OPEN=0 there.
#   SMITHFS=PATH        the smithfs binary (default target/release/smithfs)
#   FSX=PATH            the fsx binary (default: target/tools/bin/fsx, then PATH); with
#                       FSX_INSTALL=1 a missing fsx is installed with
#                       `cargo install fsx --root target/tools`
# Exit: 0 all instances passed, 1 a corruption or failure, 77 fsx not available.
# Last line: `fsx.sh: PASS ops=N instances=N seconds=S` or `fsx.sh: FAIL ...`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
smithfs=${SMITHFS:-$root/target/release/smithfs}
instances=${FSX_INSTANCES:-4}
if [ -n "${FSX_OPS:-}" ]; then
    ops=$FSX_OPS
elif [ "${SMITHFS_LONG:-0}" != 0 ]; then
    ops=1000000
else
    ops=20000
fi
seed=${FSX_SEED:-$((RANDOM * 32768 + RANDOM))}
per=$(((ops + instances - 1) / instances))

fsx=${FSX:-}
if [ -z "$fsx" ]; then
    if [ -x "$root/target/tools/bin/fsx" ]; then
        fsx=$root/target/tools/bin/fsx
    elif command -v fsx >/dev/null 2>&1; then
        fsx=$(command -v fsx)
    elif [ "${FSX_INSTALL:-0}" != 0 ]; then
        cargo install fsx --root "$root/target/tools" >&2
        fsx=$root/target/tools/bin/fsx
    else
        echo "fsx.sh: SKIP fsx not found (set FSX, or FSX_INSTALL=1 to cargo install it)"
        exit 77
    fi
fi
[ -x "$smithfs" ] || {
    echo "fsx.sh: FAIL no smithfs binary at $smithfs (cargo build --release)"
    exit 1
}

work=$(mktemp -d /tmp/smithfs-fsx.XXXXXX)
chmod 755 "$work"
mnt=$work/m
cleanup() {
    if findmnt -rn --mountpoint "$mnt" >/dev/null 2>&1; then
        "$smithfs" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true
    fi
    if [ "${FSX_KEEP:-0}" = 0 ] && ! findmnt -rn --mountpoint "$mnt" >/dev/null 2>&1; then
        rm -rf "$work"
    fi
}
trap cleanup EXIT

# Every operation fsx knows, enabled (the defaults leave most of them off) — but
# posix_fallocate: fsx 0.3.2 sometimes asks for a length of 0, which is EINVAL (on ext4 too),
# and then stops with "does not support posix_fallocate". Hole punching (also fallocate)
# stays on.
cat >"$work/fsx.toml" <<EOF
flen = 262144
[opsize]
max = 65536
min = 0
align = 1
[weights]
close_open = ${FSX_CLOSE_OPEN:-2}
read = 10
write = 10
mapread = 5
mapwrite = 5
invalidate = 1
truncate = 2
fsync = 1
fdatasync = 1
posix_fallocate = 0
punch_hole = 2
sendfile = 2
posix_fadvise = 1
copy_file_range = 2
EOF

"$smithfs" init "$mnt" >/dev/null
# The runs start in the sandbox (docs/SPEC.md §12): fsx and its settings are read from outside
# the mount, its logs written there.
python3 - "$mnt/config.json" "$(dirname "$(readlink -f "$fsx")")" "$work" <<'PY'
import json, sys
path, fsx_dir, work = sys.argv[1:]
c = json.load(open(path))
c["sandbox"] = {"readable": [fsx_dir, work], "writable": [work + "/logs"]}
json.dump(c, open(path, "w"), indent=2)
PY
# shellcheck disable=SC2086 # FSX_MOUNT_ARGS is a list of words
"$smithfs" mount "$mnt" --allow-other ${FSX_MOUNT_ARGS:-}
echo "fsx.sh: $ops operations in $instances instances of $per, seed $seed, mount args '${FSX_MOUNT_ARGS:-}', $fsx"
pids=()
t0=$(date +%s.%N)
for i in $(seq 1 "$instances"); do
    id=$(printf 'smith-%03d' "$i")
    mkdir "$mnt/smiths/smith-root/children/$id"
    priv=$mnt/smiths/smith-root/children/$id/private
    mkdir -p "$work/logs/$id"
    "$smithfs" run --mount "$mnt" --smith "smith-root/$id" -- \
        "$fsx" -N "$per" -S $((seed + i)) -f "$work/fsx.toml" -P "$work/logs/$id" "$priv/fsx.dat" \
        >"$work/logs/$id.out" 2>&1 &
    pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
    id=$(printf 'smith-%03d' $((i + 1)))
    if ! wait "${pids[$i]}"; then
        failed=$((failed + 1))
        echo "fsx.sh: $id FAILED (seed $((seed + i + 1))):"
        tail -n 40 "$work/logs/$id.out"
        FSX_KEEP=1
    fi
done
secs=$(echo "$(date +%s.%N) - $t0" | bc)
# Every instance must have said so (a crash of fsx itself is a failure too).
for i in $(seq 1 "$instances"); do
    id=$(printf 'smith-%03d' "$i")
    grep -q "All operations completed A-OK" "$work/logs/$id.out" || {
        echo "fsx.sh: $id did not report A-OK"
        failed=$((failed + 1))
    }
done
"$smithfs" umount "$mnt"
if [ "$failed" = 0 ]; then
    echo "fsx.sh: PASS ops=$((per * instances)) instances=$instances seconds=${secs%.*} seed=$seed"
    exit 0
fi
[ "${FSX_KEEP:-0}" = 0 ] || echo "fsx.sh: logs kept in $work/logs"
echo "fsx.sh: FAIL $failed of $instances instances, seed $seed"
exit 1
