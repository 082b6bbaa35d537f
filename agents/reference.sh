#!/usr/bin/env bash
date +%s.%N >private/.started 2>/dev/null || : # first instruction: run start, for hook-latency measurement
# smithfs reference agent: a census of a source tree, following the Agent Smith protocol.
#
# Runs with cwd = its smith dir and the environment of docs/SPEC.md §5 (SMITH_ID SMITH_FULL_ID
# SMITH_LEVEL SMITH_PARENT SMITH_DIR SMITH_TASK_FILE SMITH_WAKE SMITH_MOUNT). Uses only sh-level
# tools (bash, coreutils, find, grep, awk, sed, sort); never calls smithfs.
#
# The job: the task's data is a directory of files in the smith's inbox (default `inbox/data`,
# copied there by the parent). The agent counts files, lines and bytes per language (by file
# extension), per top-level directory (crate) and lists the largest files.
#
#   SMITH_WAKE=task|retry  read the task; if the data is large (more than `census-split-min-files`
#                          files) and level + 1 <= max_level, split it into at most max_children
#                          parts (top-level entries, opened further while one is heavier than a
#                          fair share; balanced by weight = files + bytes/64KiB), and for each part:
#                          mkdir children/smith-NNN, copy the part's files into the child's
#                          inbox/data/ (same relative paths), write the child's task in our
#                          private/ and mv it into the child's inbox (last: that starts the child).
#                          Exit 0 without a result. Otherwise do the census and publish.
#   SMITH_WAKE=children    read every dispatched child's outbox/result.md (a missing one: that
#                          child failed, noted), sum their machine-readable blocks, publish.
#
# Task parameters: lines `census-KEY: VALUE` anywhere in the task file (all optional):
#   census-data: inbox/data          the directory to count (relative to the smith dir)
#   census-split-min-files: 2000     split only when there are more files than this
#   census-top: 10                   how many largest files to list
#   census-max-children: 5           at most this many children (also capped by config.json)
#   census-max-level: 3              no child deeper than this (also capped by config.json)
#
# Result: outbox/result.md (written in private/, then renamed), human-readable tables followed by a
# fenced block ```census-tsv (tab-separated lines, documented in docs/AGENTS.md):
#   total  FILES LINES BYTES          lang  NAME FILES LINES BYTES      group NAME FILES LINES BYTES
#   file   LINES BYTES PATH           smiths N   maxlevel N   skipped N   missing FULL_ID REASON
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
printf '%s %s\n' "$(cat private/.started 2>/dev/null || date +%s.%N)" "$SMITH_WAKE" >>private/.runs 2>/dev/null || :
log "start: wake=$SMITH_WAKE level=$SMITH_LEVEL dir=$(pwd)"

W=private/census # our working state
mkdir -p "$W"

# ---------------------------------------------------------------------------------------------
# The task and its parameters

TASK=${SMITH_TASK_FILE:-}
if [ -z "$TASK" ] || [ ! -f "$TASK" ]; then
    # newest task-*.md in inbox/ (the protocol's "task of this run")
    TASK=$(ls -t inbox/task-*.md 2>/dev/null | head -n 1 || :)
fi
[ -n "$TASK" ] && [ -f "$TASK" ] || die "no task: SMITH_TASK_FILE is unset and inbox/ holds no task-*.md"
log "task: $TASK"

param() { # param KEY DEFAULT -> value of the first `census-KEY: value` line of the task
    v=$(sed -n "s/^[[:space:]>*-]*census-$1:[[:space:]]*\([^[:space:]].*\)\$/\1/p" "$TASK" | head -n 1 | sed 's/[[:space:]`]*$//; s/^`//')
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

DATA=$(param data inbox/data)
SPLIT_MIN=$(param split-min-files 2000)
TOP=$(param top 10)
MAX_CHILDREN=$(min "$(param max-children 5)" "$(config_limit max_children 5)")
MAX_LEVEL=$(min "$(param max-level 3)" "$(config_limit max_level 3)")
for v in SPLIT_MIN TOP MAX_CHILDREN MAX_LEVEL SMITH_LEVEL; do
    eval "is_num \"\$$v\"" || die "$v is not a number"
done
TITLE=$(sed -n 's/^# *Task: *//p' "$TASK" | head -n 1)
TITLE=${TITLE:-census}
# state belongs to one task: a new task (other name or content) starts from a clean state
TASK_KEY="$(basename "$TASK") $(cksum <"$TASK" | awk '{print $1}')"
if [ "$(cat "$W/task-key" 2>/dev/null || :)" != "$TASK_KEY" ]; then
    if [ "$SMITH_WAKE" = children ] && [ -f "$W/task-key" ]; then
        log "woken for children, but the newest task is not the one we dispatched for: working on the new one"
    fi
    rm -rf "$W/plan" "$W/dispatch.tsv" "$W/self.tsv" "$W/self-parts" "$W/self-data" "$W/dispatch.done" "$W/files.tsv" "$W/pending"
    printf '%s\n' "$TASK_KEY" >"$W/task-key"
fi

# ---------------------------------------------------------------------------------------------
# Counting

# scan DIR OUT [WCFLAGS]: one line per regular file `path<TAB>lines<TAB>bytes` (path relative to
# DIR; lines is `-` with WCFLAGS=-c, which does not read the files). wc runs on batches of names
# with /dev/null first, so every batch has a total line to drop; its output is paired with the names
# by position (wc quotes odd names, so its names are never parsed). Names with a newline or a tab,
# and unreadable files, are skipped and counted in OUT.skipped.
scan() {
    (
        cd "$1" && find . -type f -exec sh -c '
            flags=$1
            shift
            for f do
                shift
                case $f in *"	"* | *"
"*) printf "S\t\n"; continue ;; esac
                if [ -r "$f" ]; then set -- "$@" "$f"; printf "F\t%s\n" "$f"; else printf "S\t\n"; fi
            done
            [ $# -gt 0 ] || exit 0
            wc $flags /dev/null "$@" | sed "s/^/W	/"
        ' sh "${3:--lc}" {} +
    ) | awk -F '\t' -v skipped="$2.skipped" -v flags="${3:--lc}" '
        function flush(   i, n) {
            if (nw != nf + 2) { print "census: wc gave " nw " lines for " nf " files" > "/dev/stderr"; bad = 1 }
            for (i = 1; i <= nf; i++) {
                p = name[i]; sub(/^\.\//, "", p)
                n = split(wcl[i + 1], c, " ")
                if (flags == "-c") print p "\t-\t" c[1]; else print p "\t" c[1] "\t" c[2]
            }
            nf = 0; nw = 0
        }
        $1 == "S" { nskip++; next }
        $1 == "F" { if (nw > 0) flush(); name[++nf] = substr($0, 3); next }
        $1 == "W" { wcl[++nw] = substr($0, 3); next }
        END { if (nf > 0 || nw > 0) flush(); print nskip + 0 > skipped; exit bad }
    ' >"$2"
}

# census FILES.tsv OUT.block: the machine-readable block of one smith's own count
census() {
    awk -F '\t' -v top="$TOP" -v level="$SMITH_LEVEL" -v skipped="$(cat "$1.skipped" 2>/dev/null || echo 0)" '
        function lang(p,   b, e, n) {
            n = split(p, parts, "/"); b = parts[n]
            if (b in byname) return byname[b]
            if (b ~ /^\.?[^.]*$/) return "(no extension)"
            e = tolower(b); sub(/^.*\./, "", e)
            if (e in byext) return byext[e]
            return "." e
        }
        BEGIN {
            n = split("rs=Rust;c=C;h=C/C++ header;cc=C++;cpp=C++;cxx=C++;hpp=C++;hh=C++;py=Python;" \
                      "sh=Shell;bash=Shell;js=JavaScript;mjs=JavaScript;ts=TypeScript;go=Go;java=Java;" \
                      "rb=Ruby;pl=Perl;s=Assembly;asm=Assembly;toml=TOML;md=Markdown;markdown=Markdown;" \
                      "json=JSON;yml=YAML;yaml=YAML;txt=Text;html=HTML;htm=HTML;css=CSS;xml=XML;svg=SVG;" \
                      "proto=Protobuf;lock=Lockfile;cfg=Config;ini=Config;in=Template;stderr=Test output;" \
                      "stdout=Test output;ld=Linker script;pest=Pest grammar;lalrpop=LALRPOP grammar;" \
                      "wasm=WebAssembly;png=Image;jpg=Image;jpeg=Image;gif=Image;ico=Image;gz=Archive;" \
                      "zip=Archive;orig=Manifest backup", kv, ";")
            for (i = 1; i <= n; i++) { j = index(kv[i], "="); byext[substr(kv[i], 1, j - 1)] = substr(kv[i], j + 1) }
            n = split("Makefile=Makefile;makefile=Makefile;GNUmakefile=Makefile;Dockerfile=Dockerfile;" \
                      "LICENSE=License text;LICENSE-MIT=License text;LICENSE-APACHE=License text;" \
                      "COPYING=License text;.cargo_vcs_info.json=Cargo metadata;.cargo-ok=Cargo metadata;" \
                      "Cargo.toml.orig=Manifest backup", kv, ";")
            for (i = 1; i <= n; i++) { j = index(kv[i], "="); byname[substr(kv[i], 1, j - 1)] = substr(kv[i], j + 1) }
        }
        {
            p = $1; l = $2 + 0; b = $3 + 0
            F++; L += l; B += b
            g = p; if (index(g, "/")) sub(/\/.*/, "", g); else g = "(top-level files)"
            k = lang(p)
            lf[k]++; ll[k] += l; lb[k] += b
            gf[g]++; gl[g] += l; gb[g] += b
            print "file\t" l "\t" b "\t" p | "sort -t \"\t\" -k3,3nr -k4,4 | head -n " top
        }
        END {
            close("sort -t \"\t\" -k3,3nr -k4,4 | head -n " top)
            print "total\t" F + 0 "\t" L + 0 "\t" B + 0
            for (k in lf) print "lang\t" k "\t" lf[k] "\t" ll[k] "\t" lb[k]
            for (g in gf) print "group\t" g "\t" gf[g] "\t" gl[g] "\t" gb[g]
            print "smiths\t1"
            print "maxlevel\t" level
            print "skipped\t" skipped
        }
    ' "$1" >"$2.tmp"
    # the sort|head pipe wrote the file lines to stdout of awk: they are in $2.tmp too; order them
    { grep -v '^file	' "$2.tmp" || :; grep '^file	' "$2.tmp" || :; } >"$2"
    rm -f "$2.tmp"
}

# aggregate BLOCK... > OUT: sum machine-readable blocks (each from a child, or our own part)
aggregate() {
    awk -F '\t' -v top="$TOP" -v level="$SMITH_LEVEL" -v extra="${EXTRA_SMITHS:-0}" '
        $1 == "total" { F += $2; L += $3; B += $4 }
        $1 == "lang" { lf[$2] += $3; ll[$2] += $4; lb[$2] += $5 }
        $1 == "group" { gf[$2] += $3; gl[$2] += $4; gb[$2] += $5 }
        $1 == "file" { print "file\t" $2 "\t" $3 "\t" $4 | "sort -t \"\t\" -k3,3nr -k4,4 | head -n " top }
        $1 == "smiths" { S += $2 }
        $1 == "maxlevel" { if ($2 + 0 > M) M = $2 + 0 }
        $1 == "skipped" { K += $2 }
        $1 == "missing" { print }
        END {
            close("sort -t \"\t\" -k3,3nr -k4,4 | head -n " top)
            print "total\t" F + 0 "\t" L + 0 "\t" B + 0
            for (k in lf) print "lang\t" k "\t" lf[k] "\t" ll[k] "\t" lb[k]
            for (g in gf) print "group\t" g "\t" gf[g] "\t" gl[g] "\t" gb[g]
            print "smiths\t" S + extra
            print "maxlevel\t" (M > level ? M : level)
            print "skipped\t" K + 0
        }
    ' "$@" >"$W/agg.tmp"
    {
        grep -v '^file	\|^missing	' "$W/agg.tmp" || :
        grep '^missing	' "$W/agg.tmp" || :
        grep '^file	' "$W/agg.tmp" || :
    }
    rm -f "$W/agg.tmp"
}

# extract RESULT.md: the census-tsv block of a result file
extract() { awk '/^```census-tsv[[:space:]]*$/ { on = 1; next } on && /^```/ { exit } on { print }' "$1"; }

# publish BLOCK HOW: render result.md from a block, write it in private/, rename it into outbox/
publish() {
    block=$1 how=$2
    out=private/result.md
    {
        printf '# Census: %s\n\n' "$TITLE"
        awk -F '\t' -v id="$SMITH_FULL_ID" -v level="$SMITH_LEVEL" -v how="$how" -v data="$DATA" '
            function human(b) {
                if (b >= 1073741824) return sprintf("%.1f GiB", b / 1073741824)
                if (b >= 1048576) return sprintf("%.1f MiB", b / 1048576)
                if (b >= 1024) return sprintf("%.1f KiB", b / 1024)
                return b " B"
            }
            $1 == "total" { F = $2; L = $3; B = $4 }
            $1 == "smiths" { S = $2 }
            $1 == "maxlevel" { M = $2 }
            $1 == "skipped" { K = $2 }
            $1 == "missing" { miss[++nm] = "`" $2 "` — " $3 }
            END {
                print "| | |\n|---|---|"
                print "| Smith | `" id "` (level " level ") |"
                print "| Data | `" data "` |"
                print "| Files | " F " |\n| Lines | " L " |\n| Bytes | " B " (" human(B) ") |"
                print "| How | " how " |"
                print "| Smiths that counted | " S " (deepest level " M ") |"
                if (K > 0) print "| Skipped | " K " files (unreadable, or a tab/newline in the name) |"
                if (nm > 0) {
                    print "\n## Missing parts\n\nThese parts have no result (their smith failed); the totals above do not include them.\n"
                    for (i = 1; i <= nm; i++) print "- " miss[i]
                }
            }' "$block"
        printf '\n## Per language\n\n| Language | Files | Lines | Bytes |\n|---|---:|---:|---:|\n'
        { grep '^lang	' "$block" || :; } | sort -t "	" -k4,4nr -k2,2 | awk -F '\t' '{ print "| " $2 " | " $3 " | " $4 " | " $5 " |" }'
        printf '\n## Per crate / top-level directory\n\n| Directory | Files | Lines | Bytes |\n|---|---:|---:|---:|\n'
        { grep '^group	' "$block" || :; } | sort -t "	" -k4,4nr -k2,2 | awk -F '\t' '{ print "| `" $2 "` | " $3 " | " $4 " | " $5 " |" }'
        printf '\n## Largest files\n\n| File | Lines | Bytes |\n|---|---:|---:|\n'
        { grep '^file	' "$block" || :; } | awk -F '\t' '{ print "| `" $4 "` | " $2 " | " $3 " |" }'
        printf '\n## Machine-readable\n\nTab-separated; `total FILES LINES BYTES`, `lang|group NAME FILES LINES BYTES`, '
        printf '`file LINES BYTES PATH`, `smiths N`, `maxlevel N`, `skipped N`, `missing FULL_ID REASON`.\n\n'
        printf '```census-tsv\n'
        cat "$block"
        printf '```\n'
    } >"$out"
    mv -f "$out" outbox/result.md
    log "published outbox/result.md ($(awk -F '\t' '$1 == "total" { print $2 " files, " $3 " lines, " $4 " bytes" }' "$block"))"
}

do_it_myself() { # do_it_myself WHY
    if [ -d "$DATA" ]; then
        log "counting $DATA myself ($1)"
        scan "$DATA" "$W/files.tsv"
        census "$W/files.tsv" "$W/block.tsv"
        publish "$W/block.tsv" "counted by this smith ($1)"
    else
        log "no data directory $DATA: publishing an empty census"
        : >"$W/files.tsv"
        echo 0 >"$W/files.tsv.skipped"
        census "$W/files.tsv" "$W/block.tsv"
        publish "$W/block.tsv" "no data: \`$DATA\` does not exist (the reference agent only takes a census)"
    fi
    exit 0
}

# ---------------------------------------------------------------------------------------------
# Woken because every child is settled: aggregate

collect() {
    [ -s "$W/dispatch.tsv" ] || return 1
    n=0 ok=0
    : >"$W/missing.tsv"
    set --
    while IFS='	' read -r part child; do
        n=$((n + 1))
        r="children/$child/outbox/result.md"
        if [ -f "$r" ] && extract "$r" >"$W/child-$child.tsv" && grep -q '^total	' "$W/child-$child.tsv"; then
            ok=$((ok + 1))
            set -- "$@" "$W/child-$child.tsv"
            log "child $child ($part): $(awk -F '\t' '$1 == "total" { print $2 " files" }' "$W/child-$child.tsv")"
        else
            if [ -f "$r" ]; then reason="its result has no census-tsv block"; else reason="no outbox/result.md (the child failed or was cancelled)"; fi
            printf 'missing\t%s/%s\t%s\n' "$SMITH_FULL_ID" "$child" "$reason ($part: $(tr '\n' ' ' <"$W/plan/$part" | sed 's/ $//'))" >>"$W/missing.tsv"
            log "child $child ($part): MISSING, $reason"
        fi
    done <"$W/dispatch.tsv"
    set -- "$@" "$W/missing.tsv"
    how="$ok of $n children"
    if [ -f "$W/self.tsv" ]; then
        set -- "$@" "$W/self.tsv"
        how="$how + a part counted by this smith (children it could not create)"
    else
        EXTRA_SMITHS=1 # this smith counted nothing itself, but is one of the tree
    fi
    aggregate "$@" >"$W/block.tsv"
    publish "$W/block.tsv" "aggregated from $how"
    exit 0
}

if [ "$SMITH_WAKE" = children ]; then
    if [ -s "$W/dispatch.tsv" ]; then collect; fi
    log "woken for children, but this task dispatched none"
    do_it_myself "woken for children without a dispatch record"
fi

# ---------------------------------------------------------------------------------------------
# A task (or a retry): decide

[ -d "$DATA" ] || do_it_myself "no data"
if [ -f "$W/dispatch.done" ]; then
    # a retry after everything was dispatched: nothing left to do but wait (or collect)
    all=1
    while IFS='	' read -r part child; do [ -f "children/$child/outbox/result.md" ] || all=0; done <"$W/dispatch.tsv"
    if [ "$all" = 1 ]; then collect; fi
    log "all parts are dispatched; waiting for the children"
    exit 0
fi

if [ ! -d "$W/plan" ]; then
    files=$(cd "$DATA" && find . -type f | wc -l)
    log "$files files in $DATA (split above $SPLIT_MIN; level $SMITH_LEVEL of max $MAX_LEVEL; max $MAX_CHILDREN children)"
    if [ "$SMITH_LEVEL" -ge "$MAX_LEVEL" ]; then do_it_myself "level $SMITH_LEVEL is the deepest allowed"; fi
    if [ "$files" -le "$SPLIT_MIN" ]; then do_it_myself "$files files, not more than $SPLIT_MIN"; fi
    if [ "$MAX_CHILDREN" -lt 2 ]; then do_it_myself "at most $MAX_CHILDREN child allowed"; fi
    nparts=$(((files + SPLIT_MIN - 1) / SPLIT_MIN))
    nparts=$(min "$nparts" "$MAX_CHILDREN")
    [ "$nparts" -ge 2 ] || nparts=2

    # sizes only (wc -c does not read regular files), then the split plan
    scan "$DATA" "$W/sizes.tsv" -c
    mkdir -p "$W/plan.tmp"
    awk -F '\t' -v nparts="$nparts" -v dir="$W/plan.tmp" '
        # every prefix of every path gets a weight; a unit is a prefix; open the heaviest unit while
        # it is heavier than a fair share (or there are fewer units than parts) and is a directory
        {
            p = $1; w = 1 + $3 / 65536
            n = split(p, c, "/"); pre = ""
            for (i = 1; i <= n; i++) {
                q = (i == 1 ? c[1] : pre "/" c[i])
                if (!(q in wt)) { if (i == 1) top[++nt] = q; else kids[pre] = kids[pre] "\n" q; isdir[q] = (i < n) }
                if (i < n) isdir[q] = 1
                wt[q] += w; pre = q
            }
            total += w
        }
        END {
            nu = 0
            for (i = 1; i <= nt; i++) unit[++nu] = top[i]
            fair = total / nparts
            for (round = 0; round < 5000; round++) {
                h = 0
                for (i = 1; i <= nu; i++) if (isdir[unit[i]] && (h == 0 || wt[unit[i]] > wt[unit[h]])) h = i
                if (h == 0) break
                if (wt[unit[h]] <= fair && nu >= nparts) break
                m = split(substr(kids[unit[h]], 2), k, "\n")
                unit[h] = k[1]
                for (j = 2; j <= m; j++) unit[++nu] = k[j]
            }
            # greedy: heaviest unit first, into the lightest part
            for (i = 1; i <= nu; i++) print wt[unit[i]] "\t" unit[i] > (dir "/units")
        }
    ' "$W/sizes.tsv"
    sort -t "	" -k1,1nr -k2,2 "$W/plan.tmp/units" | awk -F '\t' -v nparts="$nparts" -v dir="$W/plan.tmp" '
        { b = 1; for (i = 2; i <= nparts; i++) if (load[i] < load[b]) b = i
          load[b] += $1; print $2 > (dir "/part-" b); used[b] = 1 }
    '
    rm -f "$W/plan.tmp/units"
    mv "$W/plan.tmp" "$W/plan"
fi
nplan=$(ls "$W/plan" | wc -l)
[ "$nplan" -ge 2 ] || { rm -rf "$W/plan"; do_it_myself "the data does not split"; }
log "plan: $nplan parts: $(for p in "$W"/plan/part-*; do printf '%s=%s units ' "${p##*/}" "$(wc -l <"$p")"; done)"

# ---------------------------------------------------------------------------------------------
# Dispatch: one child per part

touch "$W/dispatch.tsv" "$W/ids"
last_used() { # highest child number ever used: existing children, and our own record
    { ls children 2>/dev/null || :; cat "$W/ids"; } | sed -n 's/^smith-0*\([0-9][0-9]*\)$/\1/p' | sort -n | tail -n 1
}
errno_of() { # the errno name in mkdir's message (LC_ALL=C)
    case $1 in
    *"File exists"*) echo EEXIST ;; *"Invalid argument"*) echo EINVAL ;;
    *"quota"*) echo EDQUOT ;; *"not permitted"*) echo EPERM ;; *"ermission denied"*) echo EACCES ;;
    *) echo OTHER ;;
    esac
}
new_child() { # new_child PART -> prints the name of a freshly created child, or fails
    n=$(last_used)
    n=$((${n:-0} + 1))
    for _ in 1 2 3 4 5 6; do
        name=$(printf 'smith-%03d' "$n")
        # intent first: if this run dies after the mkdir, the next run reuses the child
        printf '%s\t%s\n' "$1" "$name" >"$W/pending"
        if err=$(mkdir "children/$name" 2>&1); then
            echo "$name" >>"$W/ids"
            echo "$name"
            return 0
        fi
        e=$(errno_of "$err")
        why=""
        if [ -n "$SMITH_MOUNT" ] && [ -r "$SMITH_MOUNT/.smithfs/why" ]; then why=$(head -c 2000 "$SMITH_MOUNT/.smithfs/why" || :); fi
        log "mkdir children/$name: $err ($e)${why:+; why: $(printf '%s' "$why" | head -n 1)}" >&2
        case $e in
        EEXIST | EINVAL)
            # the next id: the highest smith-NNN that `why` names, or simply the next number
            hint=$(printf '%s\n' "$why" | grep -o 'smith-[0-9][0-9][0-9]*' | sed 's/^smith-0*//' | sort -n | tail -n 1 || :)
            if is_num "${hint:-}" && [ "$hint" -gt "$n" ]; then n=$hint; else n=$((n + 1)); fi
            ;;
        *) return 1 ;; # EPERM (too deep), EDQUOT (too many), EACCES: no child
        esac
    done
    return 1
}

copy_part() { # copy_part PARTFILE DEST: copy the part's units (relative paths kept) into DEST
    while IFS= read -r u; do
        d=$(dirname "$u")
        mkdir -p "$2/$d"
        cp -R "$DATA/$u" "$2/$d/"
    done <"$1"
}

for pf in "$W"/plan/part-*; do
    part=${pf##*/}
    if grep -q "^$part	" "$W/dispatch.tsv"; then continue; fi # dispatched by an earlier run
    # an earlier run that died between mkdir and the task's rename left a child without a task:
    # reuse it (a child without a task would never settle)
    child=$(awk -F '\t' -v p="$part" '$1 == p { print $2 }' "$W/pending" 2>/dev/null || :)
    if [ -n "$child" ] && [ -d "children/$child" ] && ! ls "children/$child"/inbox/task-*.md >/dev/null 2>&1 &&
        [ ! -e "children/$child/outbox/result.md" ]; then
        log "reusing $child for $part (created by an interrupted run, no task yet)"
    elif ! child=$(new_child "$part"); then
        log "no child for $part: counting it myself"
        mkdir -p "$W/self-data"
        copy_part "$pf" "$W/self-data"
        echo "$part" >>"$W/self-parts"
        continue
    fi
    level=$((SMITH_LEVEL + 1))
    log "dispatch $part -> $child ($(wc -l <"$pf") units)"
    copy_part "$pf" "children/$child/inbox/data"
    tid="$SMITH_FULL_ID/$child"
    tf="private/task-$child.md"
    units=$(sed 's/^/- `/; s/$/`/' "$pf")
    cat >"$tf" <<EOF
# Task: $TITLE — part ${part#part-} of $nplan

| | |
|---|---|
| Task id | \`$tid\` |
| Assigned to | \`$child\` (level $level) |
| Parent task | \`$SMITH_FULL_ID\` ($(basename "$TASK")) |
| Created | $(date -u +%Y-%m-%dT%H:%M:%SZ) |

## Description

Take a census of the source files in \`inbox/data/\` (your parent copied them there): count files,
lines and bytes per language (by file extension) and per top-level directory (crate), and list the
largest files. Split the work among children if it is large and your level allows it.

## Context

This is part ${part#part-} of $nplan of the data of \`$SMITH_FULL_ID\`; paths are relative to the
root's data directory, so the per-directory figures add up across parts. The part holds:

$units

census-data: inbox/data
census-split-min-files: $SPLIT_MIN
census-top: $TOP
census-max-children: $MAX_CHILDREN
census-max-level: $MAX_LEVEL

## Expected output

\`outbox/result.md\` with the tables and a fenced \`census-tsv\` block (tab-separated \`total\`,
\`lang\`, \`group\`, \`file\`, \`smiths\`, \`maxlevel\`, \`skipped\`, \`missing\` lines) that your parent
sums.

## How to deliver

Write the result in your \`private/result.md\`, then publish it with
\`mv private/result.md outbox/result.md\`. If you split this task among children, end your run after
dispatching them; you will be run again when they have all finished.
EOF
    mv "$tf" "children/$child/inbox/task-$child.md" # the rename starts the child: data first, task last
    printf '%s\t%s\n' "$part" "$child" >>"$W/dispatch.tsv"
done
touch "$W/dispatch.done"

if [ -s "$W/self-parts" ]; then
    scan "$W/self-data" "$W/self-files.tsv"
    census "$W/self-files.tsv" "$W/self.tsv"
    rm -rf "$W/self-data"
fi
if [ ! -s "$W/dispatch.tsv" ]; then
    rm -f "$W/self.tsv" "$W/self-parts"
    do_it_myself "no child could be created"
fi
log "dispatched $(wc -l <"$W/dispatch.tsv") children; ending this run (smithfs wakes us with SMITH_WAKE=children)"
exit 0
