#!/usr/bin/env bash
# Test the bundled reference agent (agents/reference.sh) WITHOUT smithfs.
#
# A plain directory is laid out like a mount (config.json, smiths/smith-root/{inbox,private,outbox,
# children,conversations}, results/, .smithfs/why) and a small scheduler written in bash plays
# smithfs's part (docs/SPEC.md §4, §5): it runs the agent for every smith with a new task (cwd = the
# smith dir, the §5 environment), retries a failed run once, marks a smith done when its
# outbox/result.md appears, wakes a parent with SMITH_WAKE=children once all its children are done
# or failed, and copies the root's result to results/final.md. A `mkdir` shim on PATH enforces the
# child rules of §4 (smith-NNN strictly increasing, max_children -> EDQUOT, max_level -> EPERM,
# `why` written to .smithfs/why) and scaffolds the child, so the agent meets the same refusals it
# would meet on a mount.
#
# Scenarios:
#   synthetic   generated tree with odd names (spaces, quotes, no extension, empty, no final
#               newline, dot files), split threshold low enough to reach level 3
#   real        this repository's src/ plus a subset of the cargo registry sources (skipped when
#               ~/.cargo/registry/src is absent), 2 levels
#   failure     one level-2 smith fails every run: its parent notes it missing, totals = direct count
#               minus that part, the root still publishes
#   refusals    the shim refuses the first id (EINVAL; "why" names the next one) and allows only
#               3 children per smith (EDQUOT): the agent takes the next id and counts what it
#               could not dispatch itself
#
# Usage: tests/agent_reference.sh [SCENARIO...]      (default: all). Exit 0 if every check passes.
# KEEP=1 keeps the work directory.
set -euo pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "$0")/.." && pwd)
AGENT=${AGENT:-$HERE/agents/reference.sh}
WORK=$(mktemp -d -t smith-agent-test.XXXXXX)
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

pass=0 fail=0
ok() {
    pass=$((pass + 1))
    echo "  ok   $*"
}
bad() {
    fail=$((fail + 1))
    echo "  FAIL $*"
}
check() { # check DESCRIPTION EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then ok "$1 ($3)"; else bad "$1: expected '$2', got '$3'"; fi
}

# --- the mkdir shim (emulates §4 for `mkdir children/NAME` run in a smith dir) -----------------
SHIM=$WORK/shim
mkdir -p "$SHIM"
cat >"$SHIM/mkdir" <<'EOF'
#!/usr/bin/env bash
real=$(PATH=${PATH#*:} command -v mkdir)
if [ $# -eq 1 ] && [ -n "${SMITH_FULL_ID:-}" ] && [ -f smith.md ]; then
    case $1 in
    children/*/* | */children/*) ;;
    children/*)
        name=${1#children/}
        state="$FAKE_STATE/$(printf '%s' "$SMITH_FULL_ID" | tr / _)"
        maxid=$(cat "$state.maxid" 2>/dev/null || echo 0)
        why() { printf '%s\n' "$*" >"$SMITH_MOUNT/.smithfs/why"; }
        refuse() { echo "mkdir: cannot create directory '$1': $2" >&2; exit 1; }
        if [ $((SMITH_LEVEL + 1)) -gt "${FAKE_MAX_LEVEL:-3}" ]; then
            why "mkdir children/$name refused: level $((SMITH_LEVEL + 1)) is deeper than max_level ${FAKE_MAX_LEVEL:-3}; do the work yourself."
            refuse "$1" "Operation not permitted"
        fi
        if [ -e "$1" ]; then refuse "$1" "File exists"; fi
        num=$(printf '%s' "$name" | sed -n 's/^smith-\([0-9][0-9][0-9][0-9]*\)$/\1/p' | sed 's/^0*//')
        next=$(printf 'smith-%03d' $((maxid + 1)))
        if [ -z "$num" ] || [ "$num" -le "$maxid" ]; then
            why "mkdir children/$name refused (EINVAL): child ids are smith-NNN, strictly increasing; the next id is $next."
            refuse "$1" "Invalid argument"
        fi
        if [ "$(ls children | wc -l)" -ge "${FAKE_MAX_CHILDREN:-5}" ]; then
            why "mkdir children/$name refused (EDQUOT): $SMITH_FULL_ID already has ${FAKE_MAX_CHILDREN:-5} children."
            refuse "$1" "Disk quota exceeded"
        fi
        echo "$num" >"$state.maxid"
        tmp="children/.tmp-$name"
        "$real" "$tmp" && "$real" "$tmp/inbox" "$tmp/private" "$tmp/outbox" "$tmp/children" "$tmp/conversations"
        printf '# Smith %s\nFull id: %s/%s\nLevel: %s\n' "$name" "$SMITH_FULL_ID" "$name" $((SMITH_LEVEL + 1)) >"$tmp/smith.md"
        printf '# Start here, %s\n' "$name" >"$tmp/private/START_HERE.md"
        mv "$tmp" "$1"
        # FAKE_KILL_AFTER=FULL_ID:N - the agent of FULL_ID is killed right after its N-th child is made
        if [ "${FAKE_KILL_AFTER%:*}" = "$SMITH_FULL_ID" ] && [ "$(ls children | wc -l)" -ge "${FAKE_KILL_AFTER##*:}" ] &&
            [ ! -e "$state.killed" ]; then
            touch "$state.killed"
            kill -KILL 0
        fi
        exit 0
        ;;
    esac
fi
exec "$real" "$@"
EOF
chmod +x "$SHIM/mkdir"

# --- the simulated mount and scheduler ----------------------------------------------------------
# new_mount M TASKTEXT: lay out M like `smithfs init` would
new_mount() {
    local m=$1
    mkdir -p "$m/smiths/smith-root"/{inbox,private,outbox,children,conversations} "$m/results" "$m/agents" "$m/.smithfs"
    cat >"$m/config.json" <<'EOF'
{
  "agent": { "command": ["bash", "{mount}/agents/reference.sh"], "env": {}, "timeout_secs": 1800, "retries": 1, "kill_grace_secs": 5 },
  "scheduler": { "max_concurrent": 4 },
  "limits": { "max_level": 3, "max_children": 5 },
  "hooks": {}
}
EOF
    printf '# Smith smith-root\nLevel: 0\n' >"$m/smiths/smith-root/smith.md"
    cp "$AGENT" "$m/agents/reference.sh"
}
# start_root M TASKTEXT: the operator writes the root task (after the data)
start_root() {
    printf '%s\n' "$2" >"$1/smiths/smith-root/private/.task-root.md"
    mv "$1/smiths/smith-root/private/.task-root.md" "$1/smiths/smith-root/inbox/task-root.md"
}

RUNS=0
# run_smith M FULL_ID WAKE: one run, cwd = smith dir, environment of §5; returns the exit code
run_smith() {
    local m=$1 id=$2 wake=$3 dir rel task parent level rc run
    rel="smiths/$(printf '%s' "$id" | sed 's#/#/children/#g')"
    dir="$m/$rel"
    task=$(ls -t "$dir"/inbox/task-*.md 2>/dev/null | head -n 1 || :)
    parent=${id%/*}
    [ "$parent" != "$id" ] || parent=""
    level=$(($(printf '%s' "$id" | tr -cd / | wc -c)))
    RUNS=$((RUNS + 1))
    run=$(printf 'run-%04d' "$RUNS")
    mkdir -p "$dir/conversations/$run"
    echo "$wake" >"$dir/conversations/$run/wake"
    rc=0
    if [ -n "${FAIL_SMITH:-}" ] && [ "$id" = "$FAIL_SMITH" ]; then
        echo "injected failure" >"$dir/conversations/$run/messages.log"
        rc=3
    else
        (
            cd "$dir" &&
                env PATH="$SHIM:$PATH" SMITH_ID="${id##*/}" SMITH_FULL_ID="$id" SMITH_LEVEL="$level" \
                    SMITH_PARENT="$parent" SMITH_DIR="$dir" SMITH_TASK_FILE="$task" SMITH_WAKE="$wake" \
                    SMITH_MOUNT="$m" FAKE_STATE="$m/.fake-state" FAKE_KILL_AFTER="${FAKE_KILL_AFTER:-}" \
                    setsid bash "$m/agents/reference.sh" </dev/null >"$dir/conversations/$run/messages.log" 2>&1
        ) || rc=$?
    fi
    echo "$rc" >"$dir/conversations/$run/exit"
    return "$rc"
}

# smiths M: every registered smith's full id (the root, then children/ recursively), parents first
smiths() {
    (cd "$1/smiths" && find smith-root \( -name private -o -name inbox -o -name outbox -o -name conversations \) -prune -o -type d -print |
        awk '$0 == "smith-root" || $0 ~ /\/children\/smith-[0-9]+$/' | sed 's#/children/#/#g' | awk '{ print gsub(/\//, "/") "\t" $0 }' | sort -n | cut -f2)
}

# schedule M: run until nothing is left to do (sequential; parents first, then children, FIFO)
schedule() {
    local m=$1 progress id dir st task key
    mkdir -p "$m/.fake-state"
    local S="$m/.fake-state"
    while :; do
        progress=0
        for id in $(smiths "$m"); do
            dir="$m/smiths/$(printf '%s' "$id" | sed 's#/#/children/#g')"
            st="$S/$(printf '%s' "$id" | tr / _)"
            [ -f "$st.final" ] && continue
            if [ -f "$dir/outbox/result.md" ]; then
                echo "done" >"$st.final"
                if [ "$id" = smith-root ]; then cp "$dir/outbox/result.md" "$m/results/.final.tmp" && mv "$m/results/.final.tmp" "$m/results/final.md"; fi
                progress=1
                continue
            fi
            task=$(ls -t "$dir"/inbox/task-*.md 2>/dev/null | head -n 1 || :)
            [ -n "$task" ] || continue
            key="$(basename "$task")"
            wake=""
            if [ "$(cat "$st.ran" 2>/dev/null || :)" != "$key" ]; then
                wake=task
            elif [ "$(cat "$st.state" 2>/dev/null || :)" = waiting ]; then
                # all children settled?
                local all=1 c cst
                for c in "$dir"/children/smith-*; do
                    [ -d "$c" ] || continue
                    cst="$st"_"${c##*/}"
                    [ -f "$cst.final" ] || all=0
                done
                [ "$all" = 1 ] && wake=children
            fi
            [ -n "$wake" ] || continue
            echo "$key" >"$st.ran"
            progress=1
            local tries=0 rc
            while :; do
                rc=0
                run_smith "$m" "$id" "$wake" || rc=$?
                if [ -f "$dir/outbox/result.md" ]; then break; fi
                if [ "$rc" = 0 ] && [ -n "$(ls "$dir/children")" ]; then
                    echo waiting >"$st.state"
                    break
                fi
                tries=$((tries + 1))
                if [ "$tries" -gt 1 ]; then
                    echo failed >"$st.final"
                    echo failed >"$st.state"
                    break
                fi
                wake=retry
            done
        done
        [ "$progress" = 1 ] || break
    done
}

# tsv RESULT KEY...: the census-tsv lines of a result
tsv() { awk '/^```census-tsv/ { on = 1; next } on && /^```/ { exit } on { print }' "$1"; }
direct_total() { # direct_total DIR -> "files lines bytes"
    local f l b
    f=$(find "$1" -type f | wc -l)
    l=$(find "$1" -type f -exec cat {} + | wc -l)
    b=$(find "$1" -type f -exec cat {} + | wc -c)
    echo "$f $l $b"
}
depth() { smiths "$1" | awk -F/ 'NF - 1 > d { d = NF - 1 } END { print d + 0 }'; }

common_checks() { # common_checks M DATA_COPY
    local m=$1 data=$2 final="$1/results/final.md" id dir n prev
    if [ -f "$final" ]; then ok "results/final.md published"; else
        bad "no results/final.md"
        return
    fi
    check "final totals (files lines bytes) = direct count" "$(direct_total "$data")" \
        "$(tsv "$final" | awk -F '\t' '$1 == "total" { print $2, $3, $4 }')"
    # per top-level directory
    local mism=0 g want got
    for g in "$data"/*/; do
        g=${g%/}
        want="$(direct_total "$g")"
        got="$(tsv "$final" | awk -F '\t' -v g="${g##*/}" '$1 == "group" && $2 == g { print $3, $4, $5 }')"
        [ "$want" = "$got" ] || {
            mism=$((mism + 1))
            echo "       group ${g##*/}: direct $want, census $got"
        }
    done
    check "per-directory figures = direct count, mismatches" 0 "$mism"
    # Rust files
    local rs_direct rs_census
    rs_direct="$(find "$data" -type f -name '*.rs' | wc -l) $(find "$data" -type f -name '*.rs' -exec cat {} + | wc -l)"
    rs_census="$(tsv "$final" | awk -F '\t' '$1 == "lang" && $2 == "Rust" { print $3, $4 }')"
    [ -n "$rs_census" ] || rs_census="0 0"
    check "Rust files and lines = direct count" "$rs_direct" "$rs_census"
    # largest file
    check "largest file (bytes) = direct" "$(find "$data" -type f -exec wc -c {} + | awk '$NF != "total" { print $1 }' | sort -n | tail -n 1)" \
        "$(tsv "$final" | awk -F '\t' '$1 == "file" { print $3; exit }')"
    # smiths counted = smiths in the tree
    check "smiths in the tree = smiths reported" "$(smiths "$m" | wc -l)" "$(tsv "$final" | awk -F '\t' '$1 == "smiths" { print $2 }')"
    check "deepest level reported = deepest smith" "$(depth "$m")" "$(tsv "$final" | awk -F '\t' '$1 == "maxlevel" { print $2 }')"
    # protocol: limits, ids, results, no leftovers
    local viol=0
    for id in $(smiths "$m"); do
        dir="$m/smiths/$(printf '%s' "$id" | sed 's#/#/children/#g')"
        n=$(ls "$dir/children" | wc -l)
        [ "$n" -le 5 ] || { echo "       $id has $n children"; viol=$((viol + 1)); }
        prev=0
        for c in "$dir"/children/smith-*; do
            [ -d "$c" ] || continue
            c=${c##*/smith-}
            c=$((10#$c))
            [ "$c" -gt "$prev" ] || { echo "       $id: child ids not increasing"; viol=$((viol + 1)); }
            prev=$c
        done
        [ ! -e "$dir/private/result.md" ] || { echo "       $id left private/result.md"; viol=$((viol + 1)); }
        if [ "$id" != smith-root ]; then
            ls "$dir"/inbox/task-*.md >/dev/null 2>&1 || { echo "       $id has no task"; viol=$((viol + 1)); }
            ls "$dir"/private/task-*.md >/dev/null 2>&1 && { echo "       $id left a task in private/"; viol=$((viol + 1)); }
        fi
        [ -f "$dir/private/.started" ] || { echo "       $id: no private/.started"; viol=$((viol + 1)); }
    done
    check "protocol violations (width, ids, leftovers, start stamps)" 0 "$viol"
    [ "$(depth "$m")" -le 3 ] && ok "no smith deeper than level 3" || bad "a smith deeper than level 3"
}

summary_line() { # summary_line NAME M
    local m=$2
    printf '  -> %s: %s smiths, deepest level %s, %s runs (%s wake=task, %s wake=children, %s wake=retry), %s\n' "$1" \
        "$(smiths "$m" | wc -l)" "$(depth "$m")" "$RUNS" \
        "$(find "$m" -path '*/conversations/*/wake' -exec cat {} + | grep -c '^task$' || :)" \
        "$(find "$m" -path '*/conversations/*/wake' -exec cat {} + | grep -c '^children$' || :)" \
        "$(find "$m" -path '*/conversations/*/wake' -exec cat {} + | grep -c '^retry$' || :)" \
        "$(tsv "$m/results/final.md" 2>/dev/null | awk -F '\t' '$1 == "total" { print $2 " files, " $3 " lines, " $4 " bytes" }')"
}

task_text() { # task_text SPLIT_MIN
    cat <<EOF
# Task: Census of a source tree

## Description

Take a census of the source tree in \`inbox/data/\`: files, lines and bytes per language and per
crate (top-level directory), and the largest files.

census-data: inbox/data
census-split-min-files: $1
census-top: 10
EOF
}

# --- data ---------------------------------------------------------------------------------------
gen_synthetic() { # gen_synthetic DIR: a deterministic tree, ~700 files
    local d=$1 i j k
    mkdir -p "$d"
    for i in 1 2 3 4 5 6 7; do
        for j in $(seq 1 $((i * 3))); do
            mkdir -p "$d/crate-$i/src/mod$j" "$d/crate-$i/tests"
            for k in $(seq 1 $((5 + (i * j) % 7))); do
                seq 1 $(((i * 37 + j * 11 + k * 5) % 300)) | sed 's/^/let x = /; s/$/;/' >"$d/crate-$i/src/mod$j/f$k.rs"
            done
            printf 'fn t%s() {}' "$j" >"$d/crate-$i/tests/t$j.rs" # no final newline
        done
        printf '[package]\nname = "crate-%s"\n' "$i" >"$d/crate-$i/Cargo.toml"
        printf '# crate %s\n\nsome text\n' "$i" >"$d/crate-$i/README.md"
    done
    mkdir -p "$d/odd names/sub dir" "$d/big"
    printf 'a\nb\n' >"$d/odd names/sub dir/with space.rs"
    printf 'q\n' >"$d/odd names/it's \"quoted\".py"
    : >"$d/odd names/empty.txt"
    printf 'x\n' >"$d/odd names/Makefile"
    printf 'y\n' >"$d/odd names/.hidden"
    printf 'ü\n' >"$d/odd names/ünïcödé.md"
    seq 1 50000 >"$d/big/numbers.txt"
    printf 'top\n' >"$d/top-level-file.c"
}

# --- scenarios ----------------------------------------------------------------------------------
scenario_synthetic() {
    echo "== synthetic: generated tree, split above 20 files (3 levels expected)"
    local m=$WORK/synthetic
    RUNS=0
    new_mount "$m"
    gen_synthetic "$WORK/synthetic-data"
    cp -R "$WORK/synthetic-data" "$m/smiths/smith-root/inbox/data"
    start_root "$m" "$(task_text 20)"
    local t0
    t0=$(date +%s.%N)
    schedule "$m"
    common_checks "$m" "$WORK/synthetic-data"
    check "deepest level" 3 "$(depth "$m")"
    summary_line synthetic "$m"
    echo "     wall $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }')"
}

scenario_real() {
    local reg
    reg=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ 2>/dev/null | head -n 1 || :)
    echo "== real: this repository's src/ + 40 crates of the cargo registry, split above 150 files"
    if [ -z "$reg" ]; then
        echo "  skip: no cargo registry sources"
        return
    fi
    local m=$WORK/real d=$WORK/real-data
    RUNS=0
    new_mount "$m"
    mkdir -p "$d/smithfs"
    cp -R "$HERE/src" "$d/smithfs/src"
    for c in $(ls "$reg" | head -n 40); do cp -R "$reg/$c" "$d/$c"; done
    cp -R "$d" "$m/smiths/smith-root/inbox/data"
    start_root "$m" "$(task_text 150)"
    local t0
    t0=$(date +%s.%N)
    schedule "$m"
    common_checks "$m" "$d"
    [ "$(depth "$m")" -ge 2 ] && ok "decomposed over at least 2 levels ($(depth "$m"))" || bad "only $(depth "$m") levels"
    summary_line real "$m"
    echo "     wall $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }')"
}

scenario_failure() {
    echo "== failure: smith-root/smith-002/smith-001 fails every run"
    local m=$WORK/failure
    RUNS=0
    new_mount "$m"
    [ -d "$WORK/synthetic-data" ] || gen_synthetic "$WORK/synthetic-data"
    cp -R "$WORK/synthetic-data" "$m/smiths/smith-root/inbox/data"
    start_root "$m" "$(task_text 40)"
    FAIL_SMITH=smith-root/smith-002/smith-001 schedule "$m"
    local final=$m/results/final.md failed=$m/smiths/smith-root/children/smith-002/children/smith-001
    [ -f "$final" ] && ok "root still published" || {
        bad "no final result"
        return
    }
    check "missing part named in the final result" "smith-root/smith-002/smith-001" "$(tsv "$final" | awk -F '\t' '$1 == "missing" { print $2 }')"
    grep -q 'Missing parts' "$final" && ok "human-readable 'Missing parts' section" || bad "no 'Missing parts' section"
    local all part got
    all=$(direct_total "$WORK/synthetic-data")
    part=$(direct_total "$failed/inbox/data")
    got=$(tsv "$final" | awk -F '\t' '$1 == "total" { print $2, $3, $4 }')
    check "totals = direct count - the failed part" "$(echo "$all $part" | awk '{ print $1 - $4, $2 - $5, $3 - $6 }')" "$got"
    check "failed smith ran twice (run + retry)" 2 "$(ls "$failed/conversations" | wc -l)"
    summary_line failure "$m"
}

scenario_refusals() {
    echo "== refusals: ids 1-2 already used by the root (EINVAL), 3 children per smith (EDQUOT)"
    local m=$WORK/refusals
    RUNS=0
    new_mount "$m"
    [ -d "$WORK/synthetic-data" ] || gen_synthetic "$WORK/synthetic-data"
    cp -R "$WORK/synthetic-data" "$m/smiths/smith-root/inbox/data"
    mkdir -p "$m/.fake-state"
    echo 2 >"$m/.fake-state/smith-root.maxid" # smith-001, smith-002 used before (and removed)
    start_root "$m" "$(task_text 40)"
    FAKE_MAX_CHILDREN=3 schedule "$m"
    common_checks "$m" "$WORK/synthetic-data"
    check "root's children start after the used ids" "smith-003 smith-004 smith-005" "$(ls "$m/smiths/smith-root/children" | tr '\n' ' ' | sed 's/ $//')"
    grep -q 'EINVAL' "$m"/smiths/smith-root/conversations/*/messages.log && ok "agent met EINVAL and read why" || bad "no EINVAL in the root's log"
    grep -q 'EDQUOT' "$m"/smiths/smith-root/conversations/*/messages.log && ok "agent met EDQUOT" || bad "no EDQUOT in the root's log"
    grep -q 'a part counted by this smith' "$m/results/final.md" && ok "root counted the undispatched parts itself" || bad "root did not count the rest itself"
    summary_line refusals "$m"
}

scenario_interrupted() {
    echo "== interrupted: the root's first run is killed (SIGKILL) right after it made its 2nd child"
    local m=$WORK/interrupted
    RUNS=0
    new_mount "$m"
    [ -d "$WORK/synthetic-data" ] || gen_synthetic "$WORK/synthetic-data"
    cp -R "$WORK/synthetic-data" "$m/smiths/smith-root/inbox/data"
    start_root "$m" "$(task_text 40)"
    FAKE_KILL_AFTER=smith-root:2 schedule "$m"
    common_checks "$m" "$WORK/synthetic-data"
    check "root's first run was killed" 137 "$(cat "$m/smiths/smith-root/conversations/run-0001/exit")"
    check "the retry reused the task-less child: root's children" "smith-001 smith-002 smith-003 smith-004 smith-005" \
        "$(ls "$m/smiths/smith-root/children" | tr '\n' ' ' | sed 's/ $//')"
    summary_line interrupted "$m"
}

scenarios=${*:-synthetic real failure refusals interrupted}
for s in $scenarios; do "scenario_$s"; done
echo
echo "agent_reference: $pass passed, $fail failed"
[ "$fail" = 0 ]
