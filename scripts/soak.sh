#!/usr/bin/env bash
# Soak (issue 6): a full tree — 1 + 5 + 25 + 125 = 156 smiths — run by the bundled reference
# agent (agents/reference.sh, a census split 5 ways down to level 3) several times back to back
# on ONE daemon. After each run it waits (bounded) for the daemon's descriptors to settle, then
# records its open fds (pidfds apart), threads and RSS, the processes left under the daemon,
# the smithfs mounts, and the journal's run accounting; at the end it checks that nothing grew
# (fds within SOAK_FD_SLACK of the first run's, pidfds within SOAK_PIDFD_SLACK of the count
# before the first run — the identity cache keeps pidfds of live processes only —, threads,
# processes and mounts equal to the first run's, RSS within SOAK_RSS_SLACK_KB of it) and that
# every run is accounted for (run.started = run.exited).
#
#   scripts/soak.sh                     3 runs of the full tree (several minutes; not in CI)
#   SOAK_RUNS=1 SOAK_FANOUT=2 scripts/soak.sh   a short variant: 1 + 2 + 4 + 8 = 15 smiths
#
# Environment: SOAK_RUNS (3), SOAK_FANOUT (5, children per smith), SOAK_FILES (2, files per leaf
# directory), SOAK_TIMEOUT (1800 s per run), SOAK_RSS_SLACK_KB (8192), SOAK_FD_SLACK (16),
# SOAK_PIDFD_SLACK (8), SOAK_SETTLE_SECS (30: how long to wait for the fds to settle), SMITHFS
# (the binary, default target/release/smithfs), SOAK_KEEP=1 keeps the work dir, SOAK_TRANSPORT
# (auto, io-uring or dev-fuse: `mount --transport`; io-uring holds the machine-wide
# /sys/module/fuse/parameters/enable_uring on only while mounting and puts back what it found).
# Last line: `soak.sh: PASS …` or `soak.sh: FAIL …`; a table of the figures before it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
smithfs=${SMITHFS:-$(pwd)/target/release/smithfs}
runs=${SOAK_RUNS:-3}
fan=${SOAK_FANOUT:-5}
files=${SOAK_FILES:-2}
timeout=${SOAK_TIMEOUT:-1800}
slack=${SOAK_RSS_SLACK_KB:-8192}
fd_slack=${SOAK_FD_SLACK:-16}
pidfd_slack=${SOAK_PIDFD_SLACK:-8}
settle_secs=${SOAK_SETTLE_SECS:-30}
expect_smiths=$((1 + fan + fan * fan + fan * fan * fan))

work=$(mktemp -d /tmp/smithfs-soak.XXXXXX)
chmod 755 "$work"
mnt=$work/m
cleanup() {
    if findmnt -rn --mountpoint "$mnt" >/dev/null 2>&1; then
        "$smithfs" umount "$mnt" >/dev/null 2>&1 || umount -l "$mnt" 2>/dev/null || true
    fi
    if [ "${SOAK_KEEP:-0}" = 0 ] && ! findmnt -rn --mountpoint "$mnt" >/dev/null 2>&1; then
        rm -rf "$work"
    else
        echo "soak.sh: work dir kept: $work"
    fi
}
trap cleanup EXIT

# The data: fan × fan × fan leaf directories of $files small files, so that every smith above
# level 3 splits into $fan parts (split threshold 1 file) and every level-3 smith counts.
data=$work/data
for a in $(seq 1 "$fan"); do
    for b in $(seq 1 "$fan"); do
        for c in $(seq 1 "$fan"); do
            d=$data/a$a/b$b/c$c
            mkdir -p "$d"
            for f in $(seq 1 "$files"); do
                printf 'line %s\n' $(seq 1 $((a + b + c + f))) >"$d/f$f.txt"
            done
        done
    done
done
total_files=$((fan * fan * fan * files))

"$smithfs" init "$mnt" --agent reference >/dev/null
transport=${SOAK_TRANSPORT:-auto}
uring_param=/sys/module/fuse/parameters/enable_uring
if [ "$transport" = io-uring ]; then
    was=$(cat "$uring_param")
    echo 1 >"$uring_param"
fi
mounted=0
"$smithfs" mount "$mnt" --allow-other --transport "$transport" && mounted=1
if [ "$transport" = io-uring ]; then
    case "$was" in Y | y | 1) echo 1 >"$uring_param" ;; *) echo 0 >"$uring_param" ;; esac
fi
[ $mounted = 1 ] || { echo "soak: smithfs mount failed" >&2; exit 1; }
daemon=$(pgrep -f "smithfs mount $mnt" | sed -n 1p)
root=$mnt/smiths/smith-root
# Mounts in the work dir only: other smithfs mounts on the machine (parallel tests) come and go.
work_mounts() { awk -v w="$work" '$5 == w || index($5, w "/") == 1' /proc/self/mountinfo | wc -l; }

descendants() { # all descendants of pid $1
    local kids
    kids=$(pgrep -P "$1" || true)
    for k in $kids; do
        echo "$k"
        descendants "$k"
    done
}
figures() { # fds (without pidfds) pidfds threads rss_kb processes mounts
    local fds pidfds threads rss procs mounts
    fds=$(find "/proc/$daemon/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' | grep -vc '^anon_inode:\[pidfd\]$' || true)
    pidfds=$(find "/proc/$daemon/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' | grep -c '^anon_inode:\[pidfd\]$' || true)
    threads=$(find "/proc/$daemon/task" -mindepth 1 -maxdepth 1 | wc -l)
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$daemon/status")
    procs=$(descendants "$daemon" | wc -l)
    mounts=$(work_mounts)
    echo "$fds $pidfds $threads $rss $procs $mounts"
}
count_ev() { grep -c "\"event\":\"$1\"" "$mnt/.smithfs/events.jsonl" || true; }
fd_counts() { # fds (without pidfds) pidfds
    find "/proc/$daemon/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' |
        awk '$0 == "anon_inode:[pidfd]" { p++; next } { f++ } END { printf "%d %d\n", f, p }'
}
pidfd_owners() { # the processes the daemon holds pidfds of, as comm(pid) (needs root)
    local f n p
    for f in /proc/"$daemon"/fd/*; do
        [ "$(readlink "$f" 2>/dev/null)" = "anon_inode:[pidfd]" ] || continue
        n=${f##*/}
        p=$(awk '/^Pid:/ { print $2 }' "/proc/$daemon/fdinfo/$n" 2>/dev/null)
        [ -n "$p" ] && printf '%s(%s) ' "$(cat "/proc/$p/comm" 2>/dev/null || echo gone)" "$p"
    done
}
# Wait (polling, bounded by SOAK_SETTLE_SECS) until the daemon's descriptors settle: the same
# counts for 1 s and at most $1 pidfds (the identity cache drops those of exited processes
# within about a second). Prints the seconds it took; returns 1 if they never settled.
settle() {
    local last="" same=0 now i
    for i in $(seq 1 $((settle_secs * 10))); do
        now=$(fd_counts)
        if [ "$now" = "$last" ]; then same=$((same + 1)); else same=0 last=$now; fi
        if [ "$same" -ge 10 ] && [ "${now#* }" -le "$1" ]; then
            echo "$((i / 10)).$((i % 10))"
            return 0
        fi
        sleep 0.1
    done
    echo "$settle_secs"
    return 1
}

echo "soak.sh: $runs runs of $expect_smiths smiths ($total_files files), daemon $daemon"
settle 1000000 >/dev/null || true
before=$(figures)
pidfds0=$(echo "$before" | cut -d' ' -f2)
echo "soak.sh: before: fds pidfds threads rss_kb procs mounts = $before"
declare -a rows
fail=()
for r in $(seq 1 "$runs"); do
    t0=$(date +%s)
    # A fresh tree for every run: the operator clears the previous one through the mount.
    rm -rf "$root"/children/* "$root/outbox/result.md" "$mnt/results/final.md" "$root/inbox/data"
    cp -R "$data" "$root/inbox/data"
    cat >"$root/private/task-soak-$r.md" <<EOF
# Task: soak run $r

Take a census of \`inbox/data/\`.

census-data: inbox/data
census-split-min-files: 1
census-top: 5
census-max-children: $fan
census-max-level: 3
EOF
    started_before=$(count_ev run.started)
    exited_before=$(count_ev run.exited)
    mv "$root/private/task-soak-$r.md" "$root/inbox/task-soak-$r.md"
    if ! "$smithfs" wait "$mnt" --final --timeout "$timeout" >/dev/null; then
        fail+=("run $r did not finish")
    fi
    # Let the last runs' exits be journaled and their processes go.
    for _ in $(seq 1 100); do
        [ "$(descendants "$daemon" | wc -l)" = 0 ] && break
        sleep 0.1
    done
    secs=$(($(date +%s) - t0))
    smiths=$(awk -F '\t' '$1 == "smiths" { print $2 }' "$mnt/results/final.md" 2>/dev/null || echo 0)
    counted=$(awk -F '\t' '$1 == "total" { print $2 }' "$mnt/results/final.md" 2>/dev/null || echo 0)
    started=$(($(count_ev run.started) - started_before))
    exited=$(($(count_ev run.exited) - exited_before))
    # Last, after reading through the mount: the processes that did it have just exited.
    if ! waited=$(settle $((pidfds0 + pidfd_slack))); then
        fail+=("run $r: the daemon's descriptors did not settle within ${settle_secs} s ($(fd_counts): fds pidfds)")
    fi
    echo "soak.sh: after run $r: descriptors settled in ${waited} s; pidfds held for: $(pidfd_owners)"
    fig=$(figures)
    echo "soak.sh: after run $r: daemon fds by kind: $(find "/proc/$daemon/fd" -mindepth 1 -maxdepth 1 -printf '%l\n' |
        sed 's/:\[.*//; s/^\/.*/path/' | sort | uniq -c | awk '{ printf "%s=%s ", $2, $1 }')"
    rows+=("$r $secs $smiths $counted $started $exited $fig")
    [ "${smiths:-0}" = "$expect_smiths" ] || fail+=("run $r: $smiths smiths counted, want $expect_smiths")
    [ "${counted:-0}" = "$total_files" ] || fail+=("run $r: $counted files counted, want $total_files")
    [ "$started" = "$exited" ] || fail+=("run $r: $started run.started but $exited run.exited")
done
echo "soak.sh: run secs smiths files run.started run.exited | fds pidfds threads rss_kb procs mounts"
for row in "${rows[@]}"; do echo "soak.sh:   $row"; done
read -r _ _ _ _ _ _ fds1 _ thr1 rss1 procs1 m1 <<<"${rows[0]}"
for row in "${rows[@]}"; do
    read -r r _ _ _ _ _ _ pidfds _ _ _ _ <<<"$row"
    # The identity cache holds a pidfd per live process it resolved: once the run's processes
    # are gone, about as many as before the first run.
    [ "$pidfds" -le $((pidfds0 + pidfd_slack)) ] || fail+=("run $r: $pidfds pidfds held, $pidfds0 before the first run (slack $pidfd_slack)")
done
for row in "${rows[@]:1}"; do
    read -r r _ _ _ _ _ fds _ thr rss procs m <<<"$row"
    # Other fds: mostly the inode table (one O_PATH fd per inode the kernel holds: each run's
    # tree replaces the previous one) and the root's conversations/ entries that stay.
    [ "$fds" -le $((fds1 + fd_slack)) ] || fail+=("run $r: $fds daemon fds (pidfds aside), $fds1 after run 1 (slack $fd_slack)")
    [ "$thr" -le "$thr1" ] || fail+=("run $r: $thr daemon threads, $thr1 after run 1")
    [ "$procs" -le "$procs1" ] || fail+=("run $r: $procs processes under the daemon, $procs1 after run 1")
    [ "$m" -le "$m1" ] || fail+=("run $r: $m smithfs mounts, $m1 after run 1")
    [ "$rss" -le $((rss1 + slack)) ] || fail+=("run $r: RSS $rss kB, $rss1 kB after run 1 (slack $slack)")
done
[ "$procs1" = 0 ] || fail+=("$procs1 processes left under the daemon after run 1")
journal_bad=$(grep -vc '^{.*}$' "$mnt/.smithfs/events.jsonl" || true)
[ "$journal_bad" = 0 ] || fail+=("$journal_bad journal lines are not JSON objects")
"$smithfs" umount "$mnt"
m_after=$(work_mounts)
[ "$m_after" = 0 ] || fail+=("$m_after mounts left in $work after umount")
gone=""
for i in $(seq 1 200); do
    if ! kill -0 "$daemon" 2>/dev/null; then
        gone=$i
        break
    fi
    sleep 0.1
done
if [ -z "$gone" ]; then
    fail+=("the daemon was still running 20 s after umount")
elif [ "$gone" -gt 1 ]; then
    echo "soak.sh: the daemon exited $((gone / 10)).$((gone % 10)) s after \`smithfs umount\` returned"
fi
if [ "${#fail[@]}" = 0 ]; then
    echo "soak.sh: PASS $runs runs × $expect_smiths smiths; fds $fds1, pidfds $pidfds0 before, threads $thr1, RSS ${rss1} kB after run 1"
    exit 0
fi
printf 'soak.sh:   %s\n' "${fail[@]}"
echo "soak.sh: FAIL ${#fail[@]} problem(s)"
exit 1
