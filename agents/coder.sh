#!/usr/bin/env bash
# smithfs reference coding agent: a real edit job on the project in the smith's workspace
# (docs/SPEC.md §11), split over children by directory, merged back with plain git.
#
# Runs with cwd = its smith dir and the environment of docs/SPEC.md §5 (SMITH_ID SMITH_FULL_ID
# SMITH_LEVEL SMITH_PARENT SMITH_DIR SMITH_TASK_FILE SMITH_WAKE SMITH_MOUNT). Uses only bash,
# coreutils, grep, sed, awk and git; never calls smithfs. Needs a mount made with
# `smithfs init --repo PATH` (every smith dir has `workspace/`, a git work tree on `smith/NAME`).
#
# The job (`coder-job: license-header`, the only one): give every source file in the smith's scope
# the header lines of the task, as comments, at the top (after a `#!/` line). A source file is a
# tracked regular file (mode 100644 or 100755) whose extension is one of
#   rs c h cc cpp hpp go js ts java     ->  `// LINE`
#   sh bash py rb pl                    ->  `# LINE`
# A file whose first 10 lines already hold the first header line, and an empty file, are left alone.
#
#   SMITH_WAKE=task|retry  read the task; when the scope holds more than `coder-split-min-files`
#                          source files and level + 1 <= max level, split it by directory: the
#                          subdirectories of the scope become units, balanced by file count into
#                          at most max_children parts, one child each (mkdir children/smith-NNN —
#                          the child's workspace starts at this smith's HEAD commit —, the task
#                          written in private/ and moved into the child's inbox last). Then edit
#                          the files that lie directly in the scope (the ones no child got) and
#                          commit; end the run without a result. Without a split: edit the whole
#                          scope, commit, publish.
#   SMITH_WAKE=children    merge each child's branch into this workspace:
#                              git -C workspace pull --no-rebase --no-edit \
#                                  ../children/smith-NNN/workspace smith/<child full id, / as .>
#                          then publish. A split by directory cannot conflict (no two smiths edit
#                          one file). If a merge conflicts all the same, the agent aborts that merge
#                          (`git merge --abort`: the workspace is as before it), merges the other
#                          children, and lists the child and the conflicting paths under
#                          "Not merged" in its result (and `conflict` lines in the block); it never
#                          resolves a conflict by guessing. A child without a result is `missing`.
#
# Task parameters: lines `coder-KEY: VALUE` anywhere in the task file:
#   coder-job: license-header        the job (default; the only one)
#   coder-header: TEXT               a header line (repeat for more lines, in order; required)
#   coder-scope: DIR                 a directory of the workspace, relative to its top (repeat;
#                                    default `.`, the whole project)
#   coder-split-min-files: 40        split only when the scope holds more source files than this
#   coder-max-children: 5            at most this many children (also capped by config.json)
#   coder-max-level: 3               no child deeper than this (also capped by config.json)
#
# Result: outbox/result.md (written in private/, then renamed): a summary, then a fenced block
# ```coder-tsv of tab-separated lines that a parent sums:
#   edited N   kept N   smiths N   maxlevel N   commit SHA   branch NAME
#   merged FULL_ID COMMIT   conflict FULL_ID PATHS   missing FULL_ID REASON
set -eu
export LC_ALL=C
umask 022

SMITH_ID=${SMITH_ID:-smith-root}
SMITH_FULL_ID=${SMITH_FULL_ID:-$SMITH_ID}
SMITH_LEVEL=${SMITH_LEVEL:-0}
SMITH_WAKE=${SMITH_WAKE:-task}
SMITH_MOUNT=${SMITH_MOUNT:-}

log() { printf '%s [%s] %s\n' "$(date +%H:%M:%S.%3N)" "$SMITH_FULL_ID" "$*"; }
die() {
    log "error: $*"
    exit 1
}

[ -d inbox ] && [ -d private ] && [ -d outbox ] || die "not in a smith dir (no inbox/ private/ outbox/ in $(pwd))"
[ -d workspace/.git ] || die "no workspace/ here: the coding agent needs a mount made with 'smithfs init --repo PATH'"
log "start: wake=$SMITH_WAKE level=$SMITH_LEVEL dir=$(pwd)"
G() { git -C workspace "$@"; }
BRANCH=$(G symbolic-ref --short HEAD 2>/dev/null || echo "smith/$(printf '%s' "$SMITH_FULL_ID" | tr / .)")

W=private/coder # our working state
mkdir -p "$W"

# ---------------------------------------------------------------------------------------------
# The task and its parameters

TASK=${SMITH_TASK_FILE:-}
if [ -z "$TASK" ] || [ ! -f "$TASK" ]; then
    TASK=$(ls -t inbox/task-*.md 2>/dev/null | head -n 1 || :)
fi
[ -n "$TASK" ] && [ -f "$TASK" ] || die "no task: SMITH_TASK_FILE is unset and inbox/ holds no task-*.md"
log "task: $TASK"

params() { # params KEY -> every value of `coder-KEY: value` lines, in order
    sed -n "s/^[[:space:]>*-]*coder-$1:[[:space:]]*\([^[:space:]].*\)\$/\1/p" "$TASK" | sed 's/[[:space:]`]*$//; s/^`//'
}
param() { # param KEY DEFAULT -> the first value, or DEFAULT
    v=$(params "$1" | head -n 1)
    printf '%s\n' "${v:-$2}"
}
config_limit() { # config_limit KEY DEFAULT -> limits.KEY from the mount's config.json
    v=""
    if [ -n "$SMITH_MOUNT" ] && [ -r "$SMITH_MOUNT/config.json" ]; then
        v=$(tr -d '\n' <"$SMITH_MOUNT/config.json" | sed -n "s/.*\"$1\"[[:space:]]*:[[:space:]]*\([0-9][0-9]*\).*/\1/p" | head -n 1)
    fi
    printf '%s\n' "${v:-$2}"
}
is_num() { case ${1:-x} in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
min() { if [ "$1" -lt "$2" ]; then echo "$1"; else echo "$2"; fi; }

JOB=$(param job license-header)
[ "$JOB" = license-header ] || die "unknown coder-job '$JOB' (this agent knows license-header)"
params header >"$W/header"
[ -s "$W/header" ] || die "the task names no header line (coder-header: TEXT)"
params scope | sed 's#^\./##; s#/*$##; s#^$#.#' >"$W/scope"
[ -s "$W/scope" ] || echo . >"$W/scope"
SPLIT_MIN=$(param split-min-files 40)
MAX_CHILDREN=$(min "$(param max-children 5)" "$(config_limit max_children 5)")
MAX_LEVEL=$(min "$(param max-level 3)" "$(config_limit max_level 3)")
for v in SPLIT_MIN MAX_CHILDREN MAX_LEVEL SMITH_LEVEL; do
    eval "is_num \"\$$v\"" || die "$v is not a number"
done
while IFS= read -r s; do
    case /$s/ in */../*) die "scope '$s' leaves the workspace" ;; esac
done <"$W/scope"
TITLE=$(sed -n 's/^# *Task: *//p' "$TASK" | head -n 1)
TITLE=${TITLE:-license headers}
TASK_KEY="$(basename "$TASK") $(cksum <"$TASK" | awk '{print $1}')"
if [ "$(cat "$W/task-key" 2>/dev/null || :)" != "$TASK_KEY" ]; then
    rm -rf "$W/plan" "$W/dispatch.tsv" "$W/dispatch.done" "$W/own.tsv" "$W/pending" "$W/ids"
    printf '%s\n' "$TASK_KEY" >"$W/task-key"
fi

# ---------------------------------------------------------------------------------------------
# The edit

# sources: the source files of the scope, one `PATH<TAB>MARKER` a line (paths relative to the
# workspace top; names git has to quote are left out and logged)
sources() {
    while IFS= read -r s; do
        if [ "$s" = . ]; then G ls-files -s; else G ls-files -s -- "$s/"; fi
    done <"$W/scope" | awk -F '\t' '
        {
            split($1, m, " ")
            if (m[1] != "100644" && m[1] != "100755") next
            p = $2
            if (p ~ /^"/) { print "coder: skipping a name git quotes: " p > "/dev/stderr"; next }
            n = split(p, parts, "/"); b = parts[n]
            if (b !~ /\./) next
            e = b; sub(/^.*\./, "", e)
            if (e ~ /^(rs|c|h|cc|cpp|hpp|go|js|ts|java)$/) print p "\t//"
            else if (e ~ /^(sh|bash|py|rb|pl)$/) print p "\t#"
        }' | sort -u
}

# edit LIST OUT: give every file of LIST (lines `PATH<TAB>MARKER`) the header; OUT gets
# `edited N` and `kept N`
edit() {
    first=$(head -n 1 "$W/header")
    edited=0 kept=0
    while IFS='	' read -r p m; do
        f=workspace/$p
        if [ ! -s "$f" ] || head -n 10 "$f" | grep -qF -- "$first"; then
            kept=$((kept + 1))
            continue
        fi
        {
            if head -n 1 "$f" | grep -q '^#!/'; then head -n 1 "$f"; fi
            while IFS= read -r h; do printf '%s %s\n' "$m" "$h"; done <"$W/header"
            if head -n 1 "$f" | grep -q '^#!/'; then tail -n +2 "$f"; else cat "$f"; fi
        } >"$W/edit.tmp"
        cat "$W/edit.tmp" >"$f" # in place: the file keeps its inode and mode
        edited=$((edited + 1))
    done <"$1"
    rm -f "$W/edit.tmp"
    printf 'edited\t%s\nkept\t%s\n' "$edited" "$kept" >"$2"
    log "edited $edited files, kept $kept"
}

commit() { # commit MESSAGE: commit what the edit changed (nothing to commit is fine)
    G add -A
    if G diff --cached --quiet; then
        log "nothing to commit"
    else
        G commit -q -m "$1"
        log "committed $(G rev-parse --short HEAD): $1"
    fi
}

# publish HOW: render result.md from $W/block.tsv (own counts + children's), rename it into outbox/
publish() {
    how=$1
    {
        cat "$W/block.tsv"
        printf 'commit\t%s\nbranch\t%s\n' "$(G rev-parse HEAD)" "$BRANCH"
    } >"$W/final.tsv"
    out=private/result.md
    {
        printf '# Coding: %s\n\n' "$TITLE"
        awk -F '\t' -v id="$SMITH_FULL_ID" -v level="$SMITH_LEVEL" -v how="$how" '
            $1 == "edited" { E += $2 } $1 == "kept" { K += $2 } $1 == "smiths" { S += $2 }
            $1 == "maxlevel" { if ($2 > M) M = $2 }
            $1 == "commit" { C = $2 } $1 == "branch" { B = $2 }
            $1 == "merged" { mg[++nm] = "`" $2 "` at " substr($3, 1, 12) }
            $1 == "conflict" { cf[++nc] = "`" $2 "`: " $3 }
            $1 == "missing" { ms[++nx] = "`" $2 "`: " $3 }
            END {
                print "| | |\n|---|---|"
                print "| Smith | `" id "` (level " level ") |"
                print "| Branch | `" B "` at `" substr(C, 1, 12) "` |"
                print "| Files given the header (this subtree) | " E + 0 " |"
                print "| Files that had it already, or empty | " K + 0 " |"
                print "| Smiths that edited | " S + 0 " (deepest level " M + 0 ") |"
                print "| How | " how " |"
                if (nm > 0) { print "\n## Merged children\n"; for (i = 1; i <= nm; i++) print "- " mg[i] }
                if (nc > 0) {
                    print "\n## Not merged: conflicts\n\nThese branches conflicted; each merge was aborted (nothing of it is in this branch):\n"
                    for (i = 1; i <= nc; i++) print "- " cf[i]
                }
                if (nx > 0) { print "\n## Missing\n"; for (i = 1; i <= nx; i++) print "- " ms[i] }
            }' "$W/final.tsv"
        printf '\n## Machine-readable\n\n```coder-tsv\n'
        cat "$W/final.tsv"
        printf '```\n'
    } >"$out"
    mv -f "$out" outbox/result.md
    log "published outbox/result.md ($how)"
}

whole_scope() { # do the whole scope myself and publish
    log "editing the whole scope myself ($1)"
    sources >"$W/all.list"
    edit "$W/all.list" "$W/own.tsv"
    commit "Add license headers: $(tr '\n' ' ' <"$W/scope" | sed 's/ $//') ($SMITH_FULL_ID)"
    { cat "$W/own.tsv"; printf 'smiths\t1\nmaxlevel\t%s\n' "$SMITH_LEVEL"; } >"$W/block.tsv"
    publish "edited by this smith ($1)"
    exit 0
}

# ---------------------------------------------------------------------------------------------
# Woken because every child is settled: merge

extract() { awk '/^```coder-tsv[[:space:]]*$/ { on = 1; next } on && /^```/ { exit } on { print }' "$1"; }

collect() {
    : >"$W/children.tsv"
    while IFS='	' read -r part child; do
        cid="$SMITH_FULL_ID/$child"
        r="children/$child/outbox/result.md"
        if [ ! -f "$r" ] || ! extract "$r" >"$W/child.tsv" || ! grep -q '^branch	' "$W/child.tsv"; then
            printf 'missing\t%s\t%s\n' "$cid" "no result (the child failed or was cancelled); its part: $(tr '\n' ' ' <"$W/plan/$part" | sed 's/ $//')" >>"$W/children.tsv"
            log "child $child: MISSING"
            continue
        fi
        branch=$(awk -F '\t' '$1 == "branch" { print $2 }' "$W/child.tsv")
        # the child's subtree counts, without its own commit/branch lines
        grep -v '^commit	\|^branch	\|^merged	' "$W/child.tsv" >>"$W/children.tsv" || :
        if G pull -q --no-rebase --no-edit "../children/$child/workspace" "$branch" >"$W/pull.log" 2>&1; then
            printf 'merged\t%s\t%s\n' "$cid" "$(G rev-parse HEAD)" >>"$W/children.tsv"
            log "merged $child ($branch): now at $(G rev-parse --short HEAD)"
        else
            paths=$(G diff --name-only --diff-filter=U 2>/dev/null | tr '\n' ' ' | sed 's/ $//')
            G merge --abort >/dev/null 2>&1 || G reset -q --merge >/dev/null 2>&1 || :
            printf 'conflict\t%s\t%s\n' "$cid" "${paths:-$(tail -n 1 "$W/pull.log")}" >>"$W/children.tsv"
            log "merge of $child ($branch) failed: ${paths:-$(tail -n 1 "$W/pull.log")}; aborted, not merged"
        fi
    done <"$W/dispatch.tsv"
    {
        cat "$W/own.tsv" 2>/dev/null || printf 'edited\t0\nkept\t0\n'
        printf 'smiths\t1\nmaxlevel\t%s\n' "$SMITH_LEVEL"
        cat "$W/children.tsv"
    } >"$W/block.tsv"
    publish "own files by this smith, $(wc -l <"$W/dispatch.tsv") children merged with git pull"
    exit 0
}

if [ "$SMITH_WAKE" = children ]; then
    [ -s "$W/dispatch.tsv" ] && collect
    log "woken for children, but this task dispatched none"
    whole_scope "woken for children without a dispatch record"
fi

# ---------------------------------------------------------------------------------------------
# A task (or a retry): decide

if [ -f "$W/dispatch.done" ]; then
    all=1
    while IFS='	' read -r part child; do [ -f "children/$child/outbox/result.md" ] || all=0; done <"$W/dispatch.tsv"
    [ "$all" = 1 ] && collect
    log "all parts are dispatched; waiting for the children"
    exit 0
fi

if [ ! -d "$W/plan" ]; then
    sources >"$W/all.list"
    files=$(wc -l <"$W/all.list")
    log "$files source files in scope $(tr '\n' ' ' <"$W/scope")(split above $SPLIT_MIN; level $SMITH_LEVEL of max $MAX_LEVEL; max $MAX_CHILDREN children)"
    [ "$SMITH_LEVEL" -lt "$MAX_LEVEL" ] || whole_scope "level $SMITH_LEVEL is the deepest allowed"
    [ "$files" -gt "$SPLIT_MIN" ] || whole_scope "$files files, not more than $SPLIT_MIN"
    [ "$MAX_CHILDREN" -ge 1 ] || whole_scope "no children allowed"
    # units: the subdirectory of a scope directory each file lies in; files directly in a scope
    # directory are this smith's own
    awk -F '\t' -v scopes="$(tr '\n' '\t' <"$W/scope")" '
        BEGIN { n = split(scopes, s, "\t") }
        {
            p = $1; best = ""
            for (i = 1; i <= n; i++) {
                if (s[i] == "") continue
                pre = (s[i] == "." ? "" : s[i] "/")
                if (substr(p, 1, length(pre)) == pre && length(pre) >= length(best)) best = pre
            }
            rest = substr(p, length(best) + 1)
            if (index(rest, "/") == 0) { print $0 > "/dev/stderr"; next }
            sub(/\/.*/, "", rest)
            w[best rest]++
        }
        END { for (u in w) print w[u] "\t" u }
    ' "$W/all.list" 2>"$W/own.list" | sort -t '	' -k1,1nr -k2,2 >"$W/units"
    nunits=$(wc -l <"$W/units")
    [ "$nunits" -ge 2 ] || { [ "$nunits" -ge 1 ] && [ -s "$W/own.list" ]; } || whole_scope "the scope does not split by directory"
    nparts=$(min "$nunits" "$MAX_CHILDREN")
    mkdir -p "$W/plan.tmp"
    awk -F '\t' -v nparts="$nparts" -v dir="$W/plan.tmp" '
        { b = 1; for (i = 2; i <= nparts; i++) if (load[i] < load[b]) b = i
          load[b] += $1; print $2 > (dir "/part-" b) }
    ' "$W/units"
    mv "$W/plan.tmp" "$W/plan"
fi
log "plan: $(ls "$W/plan" | wc -l) parts: $(for p in "$W"/plan/part-*; do printf '%s=%s ' "${p##*/}" "$(tr '\n' ',' <"$p" | sed 's/,$//')"; done)"

# ---------------------------------------------------------------------------------------------
# Dispatch: one child per part (its workspace starts at our HEAD commit), then our own files

touch "$W/dispatch.tsv" "$W/ids"
last_used() { { ls children 2>/dev/null || :; cat "$W/ids"; } | sed -n 's/^smith-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 1; }
new_child() { # new_child -> the name of a freshly created child, or fails
    n=$(last_used)
    n=$((${n:-0} + 1))
    for _ in 1 2 3 4 5 6; do
        name=$(printf 'smith-%03d' "$n")
        if err=$(mkdir "children/$name" 2>&1); then
            echo "$name" >>"$W/ids"
            echo "$name"
            return 0
        fi
        log "mkdir children/$name: $err" >&2
        case $err in *"File exists"* | *"Invalid argument"*) n=$((n + 1)) ;; *) return 1 ;; esac
    done
    return 1
}

for pf in "$W"/plan/part-*; do
    part=${pf##*/}
    if grep -q "^$part	" "$W/dispatch.tsv"; then continue; fi
    child=$(awk -F '\t' -v p="$part" '$1 == p { print $2 }' "$W/pending" 2>/dev/null || :)
    if [ -n "$child" ] && [ -d "children/$child" ] && ! ls "children/$child"/inbox/task-*.md >/dev/null 2>&1; then
        log "reusing $child for $part (created by an interrupted run, no task yet)"
    elif child=$(new_child); then
        printf '%s\t%s\n' "$part" "$child" >"$W/pending"
    else
        log "no child for $part: editing it myself"
        while IFS= read -r u; do
            awk -F '\t' -v u="$u/" 'substr($1, 1, length(u)) == u' "$W/all.list" >>"$W/own.list"
        done <"$pf"
        continue
    fi
    tf="private/task-$child.md"
    {
        cat <<EOF
# Task: $TITLE — $(tr '\n' ' ' <"$pf" | sed 's/ $//')

| | |
|---|---|
| Task id | \`$SMITH_FULL_ID/$child\` |
| Assigned to | \`$child\` (level $((SMITH_LEVEL + 1))) |
| Parent task | \`$SMITH_FULL_ID\` ($(basename "$TASK")) |
| Created | $(date -u +%Y-%m-%dT%H:%M:%SZ) |

## Description

Give every source file under the directories below the license header, in your \`workspace/\`
(it starts at your parent's commit), and commit it on your branch. Split the work among children
by directory if it is large and your level allows it. Edit nothing outside these directories: your
parent merges your branch with \`git pull\`, and the other parts are other smiths'.

## Context

EOF
        sed 's/^/coder-scope: /' "$pf"
        sed 's/^/coder-header: /' "$W/header"
        printf 'coder-job: %s\ncoder-split-min-files: %s\ncoder-max-children: %s\ncoder-max-level: %s\n' \
            "$JOB" "$SPLIT_MIN" "$MAX_CHILDREN" "$MAX_LEVEL"
        cat <<EOF

## Expected output

Your branch with the edit committed, and \`outbox/result.md\` with a fenced \`coder-tsv\` block
(\`edited\`, \`kept\`, \`smiths\`, \`maxlevel\`, \`commit\`, \`branch\` lines) for your parent.
EOF
    } >"$tf"
    log "dispatch $part -> $child: $(tr '\n' ' ' <"$pf")"
    mv "$tf" "children/$child/inbox/task-$child.md" # the rename starts the child
    printf '%s\t%s\n' "$part" "$child" >>"$W/dispatch.tsv"
done
touch "$W/dispatch.done"

if [ ! -f "$W/own.tsv" ]; then
    edit "$W/own.list" "$W/own.tsv"
    commit "Add license headers: files directly in $(tr '\n' ' ' <"$W/scope" | sed 's/ $//') ($SMITH_FULL_ID)"
fi
if [ ! -s "$W/dispatch.tsv" ]; then
    { cat "$W/own.tsv"; printf 'smiths\t1\nmaxlevel\t%s\n' "$SMITH_LEVEL"; } >"$W/block.tsv"
    publish "edited by this smith (no child could be created)"
    exit 0
fi
log "dispatched $(wc -l <"$W/dispatch.tsv") children; ending this run (smithfs wakes us with SMITH_WAKE=children)"
exit 0
