#!/usr/bin/env bash
# The main job, coding edition (issue 13, docs/SPEC.md §11): a tree of bundled coding agents gives
# every source file of a real repository a license header, and the result comes back as a branch.
#
#   git clone THIS repository (HEAD) into a temporary directory — never your own clone
#   -> smithfs init CLONE/.agent-smith --repo CLONE --agent coder -> smithfs mount
#   -> the root task (private/, then mv into inbox/) -> agents/coder.sh splits the project by
#      directory over children at two levels; each child edits and commits in its own workspace;
#      each parent merges its children's branches with `git pull`
#   -> smithfs accept smith-root (the root's branch into CLONE as smith/smith-root)
#   -> git diff --stat of the accepted branch, and a check: its tree = the same edit applied
#      directly to the same commit by this script (exit 1 if not)
#
# Usage: scripts/demo-coding.sh [--no-build] [--keep] [--timeout SECS] [--split FILES] [--repo PATH]
#                                [--slurm]
#   --no-build     use the existing release binary
#   --keep         keep the temporary directory (and the mount) for a look; prints its path
#   --timeout S    give up waiting after S seconds (default 600)
#   --split N      a smith splits its scope when it holds more source files than this (default 20)
#   --repo PATH    the repository to clone (default: this one); its HEAD is used, never its work tree
#   --slurm        every run a Slurm job (docs/SPEC.md §13: launcher.kind slurm, the listener on
#                  127.0.0.1; each agent edits and commits in its workspace through its job's remote
#                  mount): on the cluster SLURM_CONF names, else on a throwaway one-node cluster this
#                  script starts (scripts/slurm/cluster.sh) and stops at the end
# Needs root (workspaces need a root daemon, docs/PROTOCOL-NOTES.md W1) and git >= 2.45.1.
set -euo pipefail
export LC_ALL=C

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$REPO BUILD=1 KEEP=0 TIMEOUT=600 SPLIT=20 SLURM=0
while [ $# -gt 0 ]; do
    case $1 in
    --no-build) BUILD=0; shift ;;
    --keep) KEEP=1; shift ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --split) SPLIT=$2; shift 2 ;;
    --repo) SRC=$2; shift 2 ;;
    --slurm) SLURM=1; shift ;;
    -h | --help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo-coding.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
SMITHFS=${SMITHFS:-${CARGO_TARGET_DIR:-$REPO/target}/release/smithfs}
bold() { if [ -t 1 ]; then printf '\033[1m%s\033[0m\n' "$*"; else printf '%s\n' "$*"; fi; }
say() { printf 'demo-coding: %s\n' "$*"; }
die() {
    printf 'demo-coding: error: %s\n' "$*" >&2
    exit 1
}
HEADER1="Copyright 2026 The smithfs authors"
HEADER2="SPDX-License-Identifier: MIT"

if [ "$BUILD" = 1 ]; then
    export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
    (cd "$REPO" && cargo build --release --quiet) || die "cargo build --release failed"
fi
[ -x "$SMITHFS" ] || die "$SMITHFS is missing (build with cargo build --release)"
command -v git >/dev/null || die "git is missing"

TMP=$(mktemp -d "${TMPDIR:-/tmp}/smithfs-coding.XXXXXX")
# The store lies below TMP, and a child's workspace is made by a git of the child's uid whose
# ownership check resolves the parent's repository's real path from / (docs/PROTOCOL-NOTES.md
# W19): every smith's uid must be able to search TMP (mktemp makes it 0700).
chmod 0755 "$TMP"
PROJECT=$TMP/project
DIR=$PROJECT/.agent-smith
MOUNTED=0
CLUSTER=""
cleanup() {
    rc=$?
    cd /
    if [ "$MOUNTED" = 1 ] && [ "$KEEP" = 0 ]; then "$SMITHFS" umount "$DIR" >/dev/null 2>&1 || say "warning: smithfs umount $DIR failed"; fi
    # The throwaway cluster goes after the mount (whose unmount cancels its jobs); --keep keeps
    # the mount, so the cluster too.
    if [ -n "$CLUSTER" ] && [ "$KEEP" = 0 ]; then "$REPO/scripts/slurm/cluster.sh" stop "$CLUSTER" || :; fi
    if [ "$KEEP" = 0 ]; then rm -rf "$TMP"; else say "kept $TMP"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. a temporary clone ------------------------------------------------------------------------
bold "== coding 1. a temporary clone of $SRC (HEAD)"
git clone -q --no-local "$SRC" "$PROJECT" || die "cannot clone $SRC"
git -C "$PROJECT" config user.name "smithfs demo"
git -C "$PROJECT" config user.email "demo@smithfs.invalid"
BASE=$(git -C "$PROJECT" rev-parse HEAD)
say "$PROJECT at $(git -C "$PROJECT" log -1 --format='%h %s' | cut -c1-70)"

# --- 2. init, mount, the root task ---------------------------------------------------------------
bold "== coding 2. smithfs init $DIR --repo $PROJECT --agent coder; mount"
"$SMITHFS" init "$DIR" --repo "$PROJECT" --agent coder | sed 's/^/  /'
if [ "$SLURM" = 1 ]; then
    if [ -z "${SLURM_CONF:-}" ]; then
        CLUSTER=$TMP/slurm
        env=$("$REPO/scripts/slurm/cluster.sh" start "$CLUSTER" --nodes 1) || die "the Slurm cluster did not start"
        eval "$env"
        say "a throwaway one-node Slurm cluster (scripts/slurm/cluster.sh): SLURM_CONF=$SLURM_CONF"
    else
        say "Slurm cluster: SLURM_CONF=$SLURM_CONF"
    fi
    python3 - "$DIR/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["launcher"] = {"kind": "slurm", "listen": "127.0.0.1:0"}
json.dump(c, open(sys.argv[1], "w"), indent=2); open(sys.argv[1], "a").write("\n")
PY
    say "config.json: launcher.kind slurm (every run a Slurm job), the listener on 127.0.0.1"
fi
"$SMITHFS" mount "$DIR"
MOUNTED=1
ROOT=$DIR/smiths/smith-root
cat >"$ROOT/private/task-root.md" <<EOF
# Task: License headers

| | |
|---|---|
| Task id | \`root\` |
| Assigned to | \`smith-root\` (level 0) |
| Parent task | \`none\` |
| Created | $(date -u +%Y-%m-%dT%H:%M:%SZ) |

## Description

Give every source file of the project (in \`workspace/\`) a license header, split over children
by directory, and merge their branches into yours.

## Context

coder-job: license-header
coder-header: $HEADER1
coder-header: $HEADER2
coder-scope: .
coder-split-min-files: $SPLIT
coder-max-level: 2

## Expected output

Your branch with every file edited; \`outbox/result.md\` with the counts.
EOF
T0=$(date +%s.%N)
mv "$ROOT/private/task-root.md" "$ROOT/inbox/task-root.md"

# --- 3. the agents work ----------------------------------------------------------------------------
bold "== coding 3. the agents work"
RC=0
"$SMITHFS" wait "$DIR" --final --timeout "$TIMEOUT" || RC=$?
WALL=$(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
"$SMITHFS" status "$DIR" || :
[ "$RC" = 0 ] || die "the root did not finish (smithfs wait: $RC); logs: smithfs logs $DIR ID"
awk '/^```coder-tsv/ { exit } { print }' "$DIR/results/final.md"

# --- 4. accept, diff --stat, check -------------------------------------------------------------------
bold "== coding 4. smithfs accept smith-root"
read -r BR COMMIT < <("$SMITHFS" accept "$DIR" smith-root) || die "smithfs accept failed"
say "accepted: $BR $COMMIT"
say "git diff --stat $(git -C "$PROJECT" rev-parse --short "$BASE")..$BR:"
git -C "$PROJECT" diff --stat "$BASE" "$BR" | tail -n 12 | sed 's/^/  /'
# sed, not head: head exits after 30 lines, and git then dies of SIGPIPE (141) under pipefail
git -C "$PROJECT" log --oneline --graph "$BASE..$BR" | sed -n '1,30s/^/  /p'

# the same edit applied directly, by this script, to a second checkout of the same commit
DIRECT=$TMP/direct
git clone -q --no-local --no-checkout "$PROJECT" "$DIRECT"
git -C "$DIRECT" checkout -q "$BASE"
n=0
while IFS= read -r line; do
    mode=${line%% *}
    path=${line#*	}
    case $mode in 100644 | 100755) ;; *) continue ;; esac
    case ${path##*/} in
    *.rs | *.c | *.h | *.cc | *.cpp | *.hpp | *.go | *.js | *.ts | *.java) c='//' ;;
    *.sh | *.bash | *.py | *.rb | *.pl) c='#' ;;
    *) continue ;;
    esac
    f=$DIRECT/$path
    [ -s "$f" ] || continue
    if awk -v h="$HEADER1" 'NR > 10 { exit } index($0, h) { f = 1 } END { exit !f }' "$f"; then continue; fi
    if [ "$(head -c 3 "$f")" = '#!/' ]; then
        sed -i "1a\\$c $HEADER1\n$c $HEADER2" "$f"
    else
        sed -i "1i\\$c $HEADER1\n$c $HEADER2" "$f"
    fi
    n=$((n + 1))
done < <(git -C "$DIRECT" ls-files -s)
git -C "$DIRECT" add -A
WANT=$(git -C "$DIRECT" write-tree)
GOT=$(git -C "$PROJECT" rev-parse "$BR^{tree}")
CHANGED=$(git -C "$PROJECT" diff --name-only "$BASE" "$BR" | wc -l)
SMITHS=$(awk -F '\t' '$1 == "smiths" { s += $2 } END { print s + 0 }' <(awk '/^```coder-tsv/ { on = 1; next } on && /^```/ { exit } on' "$DIR/results/final.md"))
bold "== coding summary"
say "wall time:  $WALL s (root task to final result)"
RUNS=$("$SMITHFS" events "$DIR" --json | grep -c '"run.started"' || :)
JOBS=$("$SMITHFS" events "$DIR" --json | grep '"run.started"' | grep -c '"job_id":"[0-9]' || :)
if [ "$SLURM" = 1 ]; then
    say "runs:       $RUNS, $JOBS of them Slurm jobs"
    [ "$JOBS" = "$RUNS" ] && [ "$RUNS" -gt 0 ] || die "not every run was a Slurm job ($JOBS of $RUNS)"
else
    say "runs:       $RUNS"
fi
say "smiths:     $SMITHS edited; $CHANGED files changed on $BR"
# a tree, not one smith: the project holds more files than --split, so the root must have split
if [ "$n" -gt "$SPLIT" ] && [ "$SMITHS" -lt 2 ]; then
    die "one smith edited all $n files: no child was created (smithfs events $DIR: access.denied)"
fi
if [ "$GOT" = "$WANT" ]; then
    say "check:      the accepted tree = the same edit applied directly ($n files; tree ${WANT:0:12})"
else
    say "check:      MISMATCH: accepted tree ${GOT:0:12}, direct edit ${WANT:0:12}:"
    git -C "$DIRECT" diff --stat "$GOT" "$WANT" | tail -n 10 >&2 || :
    exit 1
fi
# no `grep -q` after a pipe under pipefail: it may stop reading early and kill the writer with SIGPIPE
CHANGES=$(git -C "$PROJECT" status --porcelain | grep -v '^?? .agent-smith' || :)
[ -z "$CHANGES" ] || die "the clone's work tree changed"
[ "$(git -C "$PROJECT" rev-parse HEAD)" = "$BASE" ] || die "the clone's checked-out branch moved"
say "the clone's checked-out branch, index and work tree are untouched"
