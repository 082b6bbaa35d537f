#!/usr/bin/env bash
# Every citation of the specification resolves inside the repository (issue 25):
#   - a `§N` (also `§N–§M`, `§N-§M`) names a section `## N. Title` of docs/SPEC.md;
#   - `docs/AGENTS.md §Na` (or `AGENTS.md §Na`) names a section `## Na. Title` of docs/AGENTS.md;
#   - nothing names PROTOCOL.md (the contract before issue 25, outside the repository): the
#     specification is docs/SPEC.md, with the same section numbers.
# Scans every file git tracks (and untracked, not ignored ones), text only. Prints each bad
# citation as FILE:LINE: CITATION: WHY and exits 1 if there is one; else one line, exit 0.
#
# Usage: scripts/check-spec-refs.sh
set -euo pipefail
export LC_ALL=C.UTF-8

cd "$(dirname "${BASH_SOURCE[0]}")/.."
spec=docs/SPEC.md
agents=docs/AGENTS.md
[ -f "$spec" ] || {
    echo "check-spec-refs: $spec is missing" >&2
    exit 1
}

# the section numbers each document has: `## 12. The sandbox` -> 12, `## 1a. The coding agent` -> 1a
sections() { sed -nE 's/^## ([0-9]+[a-z]?)\. .*/\1/p' "$1" | tr '\n' ' '; }
spec_sections=" $(sections "$spec")"
agents_sections=" $(sections "$agents" 2>/dev/null || :)"

bad=0 n=0 shown=0
# The sections themselves: `## 1.` … `## 14.` in order (their numbers are what the code cites), and
# §12-§14 open with a **Status** line (what of the section is built today).
if [ "$spec_sections" != " 1 2 3 4 5 6 7 8 9 10 11 12 13 14 " ]; then
    echo "$spec: its sections are$spec_sections; they must be 1 … 14 in order, each \`## N. Title\`"
    bad=$((bad + 1))
fi
for sec in 12 13 14; do
    first=$(awk -v s="$sec" '$0 ~ "^## " s "\\. " { on = 1; next } on && NF { print; exit }' "$spec")
    case $first in
    '**Status'*) ;;
    *)
        echo "$spec §$sec: the first paragraph must be its **Status** line (what is built today)"
        bad=$((bad + 1))
        ;;
    esac
done
# report prints one bad citation (at most 30; the count says how many more)
report() {
    bad=$((bad + 1))
    if [ "$shown" -lt 30 ]; then
        echo "$1"
        shown=$((shown + 1))
    fi
}
# -I: skip binary files; -o: one match a line; -n: line numbers. The optional prefix is the file
# the citation names.
while IFS= read -r hit; do
    file=${hit%%:*}
    rest=${hit#*:}
    line=${rest%%:*}
    cite=${rest#*:}
    n=$((n + 1))
    num=${cite##*§}
    case $cite in
    *PROTOCOL.md*) ;; # reported below, with every other mention of that file
    *AGENTS.md*)
        if [[ $agents_sections != *" $num "* ]]; then
            report "$file:$line: $cite: docs/AGENTS.md has no section $num"
        fi
        ;;
    *)
        if [[ $spec_sections != *" $num "* ]]; then
            report "$file:$line: $cite: docs/SPEC.md has no section $num"
        fi
        ;;
    esac
done < <({ git ls-files; git ls-files --others --exclude-standard; } | sort -u |
    while IFS= read -r f; do [ -f "$f" ] && printf '%s\0' "$f"; done |
    xargs -0 grep -IHnoE '([A-Za-z0-9_./-]+\.md[`]? )?§[0-9]+[a-z]?' || :)

# The old name, cited anywhere (also where the `§N` went to the next line): this script and its
# own mention in scripts/test.sh aside.
while IFS= read -r hit; do
    report "${hit%%:PROTOCOL.md}: PROTOCOL.md is outside the repository: cite docs/SPEC.md"
done < <(git grep --untracked -IHnoF 'PROTOCOL.md' -- . ':!scripts/check-spec-refs.sh' || :)

if [ "$bad" != 0 ]; then
    [ "$bad" -le "$shown" ] || echo "… and $((bad - shown)) more"
    echo "check-spec-refs: $bad citations do not resolve ($n § citations checked, and every mention of PROTOCOL.md)"
    exit 1
fi
echo "check-spec-refs: all $n § citations resolve (docs/SPEC.md has $(wc -w <<<"$spec_sections") sections)"
