#!/usr/bin/env bash
# The main job, end to end: a tree of reference agents takes a census of a real source tree.
#
#   build smithfs -> smithfs init DIR --agent reference -> smithfs mount DIR
#   -> copy the data (this repository's src/ + cargo registry sources) THROUGH THE MOUNT into
#      smiths/smith-root/inbox/data/ -> write the root task (private/, then mv into inbox/)
#   -> the reference agents split the data over 2-3 levels (each parent copies each child's part
#      into the child's inbox), count in parallel, aggregate back up
#   -> live status tree -> results/final.md, wall time, number of runs -> smithfs umount DIR
#
# Usage: scripts/demo.sh [DIR] [--crates N|all] [--split FILES] [--timeout SECS] [--resume]
#                        [--no-build] [--driver auto|smithfs|operator] [--keep-mounted]
#                        [--coding | --coding-only] [--ui] [--slurm]
#   DIR            default ./.agent-smith-demo (a second run starts clean; --resume remounts the
#                  existing DIR with `smithfs mount --resume` and waits for the same job instead)
#   --crates N     how many cargo registry crates to add (default 80, sorted by name; `all`)
#   --split FILES  a smith splits its data when it holds more files than this
#                  (default: total/12, which gives 2 levels; smaller gives 3)
#   --timeout S    give up waiting after S seconds (default 900)
#   --driver       who runs the agents. `smithfs` (the daemon's scheduler, docs/SPEC.md §5);
#                  `operator`: this script plays the scheduler itself, running agents/reference.sh
#                  as the operator through the mount (max 4 at a time) - a stand-in for smithfs
#                  builds without scheduling; `auto` (default): smithfs if this build has
#                  `smithfs wait`, else operator.
#   --coding       after the census, run the coding edition (scripts/demo-coding.sh): a tree of
#                  coding agents adds license headers to a temporary clone of this repository in
#                  workspaces, merges the branches, `smithfs accept`s the root's, checks the result
#   --coding-only  only the coding edition
#   --ui           serve the fleet in a browser while the demo runs (`smithfs ui`, docs/SPEC.md
#                  §14): prints its URL (127.0.0.1, a random token; from another machine use
#                  `ssh -L PORT:127.0.0.1:PORT`); the page follows the tree live until the demo ends
#   --slurm        every run a Slurm job (docs/SPEC.md §13: launcher.kind slurm, the listener on
#                  127.0.0.1): on the cluster SLURM_CONF names, else on a throwaway one-node cluster
#                  this script starts (scripts/slurm/cluster.sh, needs root) and stops at the end;
#                  with --coding or --coding-only the coding edition's runs are Slurm jobs too
#                  (scripts/demo-coding.sh --slurm).
# Exit 0 when results/final.md is there (and its totals match a direct count), 1 otherwise.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=./.agent-smith-demo CRATES=80 SPLIT="" TIMEOUT=900 RESUME=0 BUILD=1 DRIVER=auto KEEP=0 CODING=0 UI=0 SLURM=0
while [ $# -gt 0 ]; do
    case $1 in
    --crates) CRATES=$2; shift 2 ;;
    --split) SPLIT=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --no-build) BUILD=0; shift ;;
    --driver) DRIVER=$2; shift 2 ;;
    --keep-mounted) KEEP=1; shift ;;
    --coding) CODING=1; shift ;;
    --coding-only) CODING=2; shift ;;
    --ui) UI=1; shift ;;
    --slurm) SLURM=1; shift ;;
    -h | --help) sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "demo.sh: unknown option $1" >&2; exit 2 ;;
    *) DIR=$1; shift ;;
    esac
done
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
SMITHFS=${CARGO_TARGET_DIR:-$REPO/target}/release/smithfs
ROOT=$DIR/smiths/smith-root
bold() { if [ -t 1 ]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }
say() { printf 'demo: %s\n' "$*"; }
die() {
    printf 'demo: error: %s\n' "$*" >&2
    exit 1
}
has_cmd() { "$SMITHFS" help "$1" >/dev/null 2>&1; } # does this build have `smithfs $1`?
is_mounted() { awk -v d="$DIR" '$2 == d { f = 1 } END { exit !f }' /proc/self/mounts; }

# --- 1. dependencies and build -------------------------------------------------------------------
bold "== 1. dependencies and build"
if ! command -v fusermount3 >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1; then
    if [ -x "$REPO/scripts/install-deps.sh" ]; then
        say "installing dependencies (scripts/install-deps.sh)"
        "$REPO/scripts/install-deps.sh"
    else
        die "fusermount3 or a C compiler is missing"
    fi
fi
[ -c /dev/fuse ] || die "/dev/fuse is missing (modprobe fuse)"
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if [ "$BUILD" = 1 ]; then
    # Progress every 10 s while cargo works (scripts/build.sh): never two silent minutes.
    "$REPO/scripts/build.sh" || die "cargo build --release failed"
fi
[ -x "$SMITHFS" ] || die "$SMITHFS is missing (build with cargo build --release)"
say "smithfs: $("$SMITHFS" --version)"
if [ "$DRIVER" = auto ]; then
    if has_cmd wait; then DRIVER=smithfs; else DRIVER=operator; fi
fi
case $DRIVER in smithfs | operator) ;; *) die "--driver must be auto, smithfs or operator" ;; esac
if [ "$DRIVER" = operator ]; then
    say "this smithfs build has no scheduler CLI (smithfs wait/status): this script runs the agents"
    say "itself, as the operator, through the mount (--driver operator)"
fi

CODING_ARGS=(--no-build --timeout "$TIMEOUT")
if [ "$SLURM" = 1 ]; then CODING_ARGS+=(--slurm); fi
if [ "$CODING" = 2 ]; then exec "$REPO/scripts/demo-coding.sh" "${CODING_ARGS[@]}"; fi

MOUNTED_BY_US=0
declare -A PID2ID
stop_runs() { # the operator driver's live runs: TERM their process groups, KILL after 3 s
    local p n=0
    for p in "${!PID2ID[@]}"; do kill -TERM -- "-$p" 2>/dev/null && n=$((n + 1)) || :; done
    [ "$n" = 0 ] && return 0
    say "stopping $n live runs"
    for _ in 1 2 3 4 5 6; do
        sleep 0.5
        n=0
        for p in "${!PID2ID[@]}"; do kill -0 -- "-$p" 2>/dev/null && n=$((n + 1)) || :; done
        [ "$n" = 0 ] && break
    done
    for p in "${!PID2ID[@]}"; do kill -KILL -- "-$p" 2>/dev/null || :; done
    wait 2>/dev/null || :
    PID2ID=()
}
UI_PID=""
CLUSTER=""
cleanup() {
    rc=$?
    stop_runs
    if [ -n "$UI_PID" ]; then kill "$UI_PID" 2>/dev/null || :; fi
    if [ "$MOUNTED_BY_US" = 1 ] && [ "$KEEP" = 0 ] && is_mounted; then
        cd /
        "$SMITHFS" umount "$DIR" >/dev/null 2>&1 || say "warning: smithfs umount $DIR failed"
    fi
    # The throwaway cluster goes after the mount (whose unmount cancels its jobs).
    if [ -n "$CLUSTER" ] && ! is_mounted; then
        "$REPO/scripts/slurm/cluster.sh" stop "$CLUSTER" || :
        rm -rf "$CLUSTER"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 2. a clean (or resumed) directory ------------------------------------------------------------
bold "== 2. smithfs init $DIR --agent reference"
if is_mounted; then
    say "$DIR is mounted (an earlier run?): unmounting it"
    "$SMITHFS" umount "$DIR" || die "cannot unmount $DIR"
fi
if [ "$RESUME" = 1 ] && [ -d "$ROOT" ] && [ -f "$DIR/.demo-task.md" ]; then
    say "resuming the job in $DIR"
else
    RESUME=0
    # start clean: only remove what looks like a smithfs directory (or an empty one)
    if [ -n "$(ls -A "$DIR")" ]; then
        [ -f "$DIR/config.json" ] && [ -d "$DIR/smiths" ] || die "$DIR is not empty and is not a smithfs directory; not removing it"
        rm -rf "$DIR"
        mkdir -p "$DIR"
    fi
    if "$SMITHFS" init "$DIR" --agent reference >/dev/null 2>"$DIR.init.err"; then
        say "initialised with the bundled reference agent"
    else
        # this build has no --agent yet: init plainly, then do what `--agent reference` does
        grep -q -- '--agent' "$DIR.init.err" || {
            cat "$DIR.init.err" >&2
            die "smithfs init failed"
        }
        "$SMITHFS" init "$DIR" >/dev/null
        cp "$REPO/agents/reference.sh" "$DIR/agents/reference.sh"
        python3 - "$DIR/config.json" "$REPO/agents/configs/reference.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c["agent"] = json.load(open(sys.argv[2]))
json.dump(c, open(sys.argv[1], "w"), indent=2); open(sys.argv[1], "a").write("\n")
EOF
        say "initialised; this build has no 'init --agent': installed agents/reference.sh and its config by hand"
    fi
    rm -f "$DIR.init.err"
fi

# --- 2b. every run a Slurm job (--slurm) -------------------------------------------------------------
if [ "$SLURM" = 1 ]; then
    [ "$DRIVER" = smithfs ] || die "--slurm needs the daemon's scheduler (--driver smithfs)"
    if [ -z "${SLURM_CONF:-}" ]; then
        bold "== 2b. a throwaway one-node Slurm cluster (scripts/slurm/cluster.sh)"
        CLUSTER=$DIR.slurm
        rm -rf "$CLUSTER"
        env=$("$REPO/scripts/slurm/cluster.sh" start "$CLUSTER" --nodes 1) || die "the cluster did not start"
        eval "$env"
        say "cluster up: SLURM_CONF=$SLURM_CONF"
    else
        say "Slurm cluster: SLURM_CONF=$SLURM_CONF"
    fi
    python3 - "$DIR/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["launcher"] = {"kind": "slurm", "listen": "127.0.0.1:0"}
json.dump(c, open(sys.argv[1], "w"), indent=2); open(sys.argv[1], "a").write("\n")
EOF
    say "config.json: launcher.kind slurm, the listener on 127.0.0.1"
fi

# --- 3. mount ---------------------------------------------------------------------------------------
bold "== 3. smithfs mount $DIR"
if [ "$RESUME" = 1 ]; then "$SMITHFS" mount "$DIR" --resume; else "$SMITHFS" mount "$DIR"; fi
MOUNTED_BY_US=1
is_mounted || die "$DIR is not mounted after smithfs mount"
if [ "$UI" = 1 ]; then
    # The fleet in a browser for as long as the demo runs: the URL (with its token) is printed
    # here and nowhere else; cleanup stops the server.
    "$SMITHFS" ui "$DIR" >"$DIR.ui-url" 2>/dev/null &
    UI_PID=$!
    for _ in $(seq 1 50); do [ -s "$DIR.ui-url" ] && break; sleep 0.1; done
    [ -s "$DIR.ui-url" ] || die "smithfs ui did not start"
    bold "== the fleet in a browser: $(cat "$DIR.ui-url")"
    rm -f "$DIR.ui-url"
fi

# --- 4. the data, through the mount; then the task ---------------------------------------------------
DATA=$ROOT/inbox/data
T0=$(date +%s.%N)
if [ "$RESUME" = 0 ]; then
    bold "== 4. data: this repository's src/ + cargo registry sources -> smith-root/inbox/data (through the mount)"
    REG=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/ 2>/dev/null | sed -n 1p || :)
    mkdir -p "$DATA/smithfs"
    cp -R "$REPO/src" "$DATA/smithfs/src"
    cp "$REPO/Cargo.toml" "$DATA/smithfs/"
    n=0
    if [ -n "$REG" ]; then
        for c in "$REG"*/; do
            [ "$CRATES" = all ] || [ "$n" -lt "$CRATES" ] || break
            c=${c%/}
            cp -R "$c" "$DATA/${c##*/}"
            n=$((n + 1))
        done
    else
        say "no cargo registry sources under ${CARGO_HOME:-$HOME/.cargo}/registry/src: counting src/ only"
    fi
    FILES=$(find "$DATA" -type f | wc -l)
    # the direct count to check the census against, taken now (before the tree grows)
    echo "$FILES $(find "$DATA" -type f -exec cat {} + | wc -l) $(find "$DATA" -type f -exec cat {} + | wc -c)" >"$DIR/.demo-direct"
    say "copied smithfs/src and $n crates: $FILES files, $(du -sh "$DATA" | cut -f1) in $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f s", b - a }')"
    [ -n "$SPLIT" ] || SPLIT=$(((FILES + 11) / 12))
    [ "$SPLIT" -ge 50 ] || SPLIT=50
    cat >"$DIR/.demo-task.md" <<EOF
# Task: Census of a source tree

| | |
|---|---|
| Task id | \`root\` |
| Assigned to | \`smith-root\` (level 0) |
| Parent task | \`none\` |
| Created | $(date -u +%Y-%m-%dT%H:%M:%SZ) |

## Description

Take a census of the source tree in \`inbox/data/\`: this repository's \`src/\` (as \`smithfs/\`)
and $n crates from the cargo registry, one top-level directory each. Count files, lines and bytes
per language (by file extension) and per crate (top-level directory), and list the largest files.
Split the work among children when it is large.

## Context

Given by the operator (scripts/demo.sh).

census-data: inbox/data
census-split-min-files: $SPLIT
census-top: 15

## Expected output

\`outbox/result.md\`: the tables, and a machine-readable \`census-tsv\` block.
EOF
    # the operator writes the task in the root's private/ and renames it into the inbox: the
    # rename is what starts the root
    cp "$DIR/.demo-task.md" "$ROOT/private/task-root.md"
    mv "$ROOT/private/task-root.md" "$ROOT/inbox/task-root.md"
    T0=$(date +%s.%N)
    say "root task written (split above $SPLIT files): smiths/smith-root/inbox/task-root.md"
fi

# --- 5. the run --------------------------------------------------------------------------------------
bold "== 5. the agents work (driver: $DRIVER)"
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
RC=0
if [ "$DRIVER" = smithfs ]; then
    # show the live tree while waiting for the final result
    if [ -t 1 ] && has_cmd status; then
        "$SMITHFS" status "$DIR" --watch &
        WATCH=$!
        "$SMITHFS" wait "$DIR" --final --timeout "$TIMEOUT" || RC=$?
        kill "$WATCH" 2>/dev/null || :
        wait "$WATCH" 2>/dev/null || :
    else
        "$SMITHFS" wait "$DIR" --final --timeout "$TIMEOUT" &
        WAITER=$!
        # Poll often (the wall time is taken when the waiter ends), show the tree every 5 s.
        ticks=0
        while kill -0 "$WAITER" 2>/dev/null; do
            sleep 0.2
            ticks=$((ticks + 1))
            [ $((ticks % 25)) = 0 ] || continue
            kill -0 "$WAITER" 2>/dev/null || break
            echo "--- $(elapsed) s"
            if has_cmd status; then "$SMITHFS" status "$DIR" || :; fi
        done
        wait "$WAITER" || RC=$?
    fi
    has_cmd status && "$SMITHFS" status "$DIR" || :
    case $RC in 0) ;; 124) say "timed out after $TIMEOUT s" ;; *) say "the root failed or was cancelled (smithfs wait: $RC)" ;; esac
else
    # --- the operator plays the scheduler (docs/SPEC.md §5), through the mount --------------------
    declare -A ST RUNS KEY
    NRUN=0 MAXC=4 LIVE=0
    sdir() { printf '%s/smiths/%s' "$DIR" "$(printf '%s' "$1" | sed 's#/#/children/#g')"; }
    discover() { # every smith, parents first
        (cd "$DIR/smiths" && find smith-root \( -name private -o -name inbox -o -name outbox -o -name conversations -o -name .claude \) -prune -o -type d -print |
            awk '$0 == "smith-root" || $0 ~ /\/children\/smith-[0-9]+$/' | sed 's#/children/#/#g' | sort)
    }
    launch() { # launch ID WAKE
        local id=$1 wake=$2 d lvl parent task run
        d=$(sdir "$id")
        lvl=$(printf '%s' "$id" | tr -cd / | wc -c)
        parent=${id%/*}
        [ "$parent" != "$id" ] || parent=""
        task=$(ls -t "$d"/inbox/task-*.md 2>/dev/null | sed -n 1p)
        NRUN=$((NRUN + 1))
        RUNS[$id]=$((${RUNS[$id]:-0} + 1))
        run=$(printf 'run-%04d' "$NRUN")
        mkdir -p "$d/conversations/$run"
        (
            cd "$d" && exec setsid env SMITH_ID="${id##*/}" SMITH_FULL_ID="$id" SMITH_LEVEL="$lvl" SMITH_PARENT="$parent" \
                SMITH_DIR="$d" SMITH_TASK_FILE="$task" SMITH_WAKE="$wake" SMITH_MOUNT="$DIR" \
                bash "$DIR/agents/reference.sh" </dev/null >"$d/conversations/$run/messages.log" 2>&1
        ) &
        PID2ID[$!]=$id
        ST[$id]=running
        LIVE=$((LIVE + 1))
    }
    show() {
        printf -- '--- %s s: %s runs, %s live\n' "$(elapsed)" "$NRUN" "$LIVE"
        for id in $(discover); do
            printf '%*s%-14s %-8s runs %s%s\n' $((2 * $(printf '%s' "$id" | tr -cd / | wc -c))) '' "${id##*/}" \
                "${ST[$id]:-idle}" "${RUNS[$id]:-0}" "$([ -f "$(sdir "$id")/outbox/result.md" ] && echo '  result' || :)"
        done
    }
    declare -A TRIES
    last=0
    while :; do
        for id in $(discover); do
            d=$(sdir "$id")
            st=${ST[$id]:-idle}
            case $st in running | done | failed) continue ;; esac
            # a plain passthrough mount does not scaffold children yet: supply the areas
            for a in inbox private outbox children conversations; do [ -d "$d/$a" ] || mkdir -p "$d/$a"; done
            if [ -f "$d/outbox/result.md" ]; then ST[$id]="done"; continue; fi
            task=$(ls -t "$d"/inbox/task-*.md 2>/dev/null | sed -n 1p || :)
            [ -n "$task" ] || continue
            wake=""
            if [ "${KEY[$id]:-}" != "$task" ]; then
                wake=task
            elif [ "$st" = waiting ]; then
                all=1
                for c in "$d"/children/smith-*; do
                    [ -d "$c" ] || continue
                    case ${ST[$id/${c##*/}]:-idle} in done | failed) ;; *) all=0 ;; esac
                done
                [ "$all" = 1 ] && wake=children
            elif [ "$st" = retry ]; then
                wake=retry
            fi
            [ -n "$wake" ] && [ "$LIVE" -lt "$MAXC" ] || continue
            KEY[$id]=$task
            launch "$id" "$wake"
        done
        if [ "${ST[smith-root]:-}" = "done" ] || [ "${ST[smith-root]:-}" = failed ]; then break; fi
        if [ "$(awk -v a="$T0" -v b="$(date +%s)" 'BEGIN { print (b - a > '"$TIMEOUT"') }')" = 1 ]; then
            say "timed out after $TIMEOUT s"
            RC=124
            break
        fi
        if [ "$LIVE" -gt 0 ]; then
            pid="" rc=0
            wait -n -p pid || rc=$?
            if [ -n "$pid" ] && [ -n "${PID2ID[$pid]:-}" ]; then
                id=${PID2ID[$pid]}
                unset "PID2ID[$pid]"
                LIVE=$((LIVE - 1))
                d=$(sdir "$id")
                if [ -f "$d/outbox/result.md" ]; then
                    ST[$id]="done"
                    if [ "$id" = smith-root ]; then
                        cp "$d/outbox/result.md" "$DIR/results/.final.md.tmp" && mv "$DIR/results/.final.md.tmp" "$DIR/results/final.md"
                    fi
                elif [ "$rc" = 0 ] && [ -n "$(ls "$d/children")" ]; then
                    ST[$id]=waiting # dispatched; woken with SMITH_WAKE=children once they settle
                else
                    TRIES[$id]=$((${TRIES[$id]:-0} + 1))
                    if [ "${TRIES[$id]}" -le 1 ]; then ST[$id]=retry; else ST[$id]=failed; fi
                    say "$id: run failed (exit $rc)$([ "${ST[$id]}" = failed ] && echo ', giving up' || echo ', retrying')"
                fi
            fi
        else
            sleep 0.2
        fi
        now=$(date +%s)
        if [ $((now - last)) -ge 3 ]; then
            show
            last=$now
        fi
    done
    stop_runs
    show
    [ "${ST[smith-root]:-}" = "done" ] || RC=1
fi

# --- 6. the answer -------------------------------------------------------------------------------------
WALL=$(elapsed)
bold "== 6. results/final.md"
if [ ! -f "$DIR/results/final.md" ]; then
    say "no results/final.md"
    [ "$RC" != 0 ] || RC=1
else
    # the machine-readable block is for parents; show its size only
    awk '/^```census-tsv/ { on = 1; n = 0; print; next }
         on && /^```/ { print "(" n " tab-separated lines: see results/final.md)"; on = 0; print; next }
         on { n++; next } { print }' "$DIR/results/final.md"
fi
echo
bold "== summary"
SMITHS=$(cd "$DIR/smiths" && find smith-root \( -name private -o -name inbox -o -name outbox -o -name conversations \) -prune -o -type d -print |
    awk '$0 == "smith-root" || $0 ~ /\/children\/smith-[0-9]+$/' | wc -l)
DEPTH=$(cd "$DIR/smiths" && find smith-root \( -name private -o -name inbox -o -name outbox -o -name conversations \) -prune -o -type d -print |
    awk '$0 ~ /\/children\/smith-[0-9]+$/ { n = gsub(/\/children\//, "&"); if (n > d) d = n } END { print d + 0 }')
if [ "$DRIVER" = smithfs ] && has_cmd events; then
    RUNCOUNT=$("$SMITHFS" events "$DIR" --json | grep -c '"run.started"' || :)
elif [ -r "$DIR/.smithfs/status.json" ]; then
    RUNCOUNT=$(grep -o '"runs"[[:space:]]*:[[:space:]]*[0-9]*' "$DIR/.smithfs/status.json" | awk -F: '{ s += $2 } END { print s + 0 }')
else
    RUNCOUNT=$(find "$DIR/smiths" -type d -path '*/conversations/*' -name 'run*' | wc -l)
fi
say "wall time:  $WALL s (from the root task to the final result)"
say "runs:       $RUNCOUNT"
say "smiths:     $SMITHS over $((DEPTH + 1)) levels (root = 0, deepest $DEPTH)"
if [ -f "$DIR/results/final.md" ] && [ -f "$DIR/.demo-direct" ]; then
    got=$(awk '/^```census-tsv/ { on = 1; next } on && /^```/ { exit } on && $1 == "total" { print $2, $3, $4 }' "$DIR/results/final.md")
    want=$(cat "$DIR/.demo-direct")
    if [ "$got" = "$want" ]; then
        say "check:      census totals = direct count ($want: files lines bytes)"
    else
        say "check:      MISMATCH: census $got, direct count $want (files lines bytes)"
        [ "$RC" != 0 ] || RC=1
    fi
fi

# --- 7. unmount ----------------------------------------------------------------------------------------
if [ "$KEEP" = 1 ]; then
    say "left mounted (--keep-mounted): smithfs umount $DIR"
else
    bold "== 7. smithfs umount $DIR"
    cd /
    "$SMITHFS" umount "$DIR" && MOUNTED_BY_US=0 || say "warning: smithfs umount failed"
    say "the tree stays in $DIR (run logs in smiths/**/conversations/); scripts/demo.sh again starts clean"
fi
if [ "$CODING" = 1 ]; then
    echo
    "$REPO/scripts/demo-coding.sh" "${CODING_ARGS[@]}" || RC=$?
fi
exit "$RC"
