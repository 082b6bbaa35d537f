#!/usr/bin/env bash
# Run pjdfstest (crates.io `pjdfstest`, the Rust rewrite) inside DIR and judge the result.
#
# Usage: scripts/pjdfstest.sh [options] DIR [-- PATTERN...]
#
#   DIR                    an existing directory to test in, usually inside a FUSE mount;
#                          pjdfstest makes a temporary directory in it and removes it after
#   --expect-file F        tests allowed to fail or to be skipped: one test name a line, each
#                          with a `# reason` comment ('#' starts a comment; blank lines ignored)
#   --log F                raw pjdfstest output (default target/pjdfstest/pjdfstest-<time>.log)
#   --secondary-fs D       a directory on another filesystem, for the EXDEV tests
#                          (default: a fresh temporary directory under /dev/shm)
#   --naptime S            pjdfstest's sleep between timestamp changes (default 0.01)
#   --config F             use this pjdfstest TOML config instead of the generated one
#   --timeout S            kill pjdfstest after S seconds (default 1800)
#   --allow-skips          do not count unexpected skips as a failure
#   -- PATTERN...          only the tests whose names contain a PATTERN
#
# Prints the counts (failed/passed/skipped/total), the failing tests (with the first line
# of each failure message) and the skips that the configuration does not explain, then a
# machine-readable line:
#   pjdfstest.sh: RESULT failed=F passed=P skipped=S total=T unexpected_failures=U unexpected_skips=K
# Exit status: 0 when every failure and unexplained skip is listed in the expect file,
# 1 when not, 2 on a usage or setup error (pjdfstest missing, no summary, timeout, ...).
#
# The generated config enables posix_fallocate, utime_now, utimensat, rename_ctime; sets
# allow_remount = false (the 13 EROFS tests are skipped by configuration, as on ext4);
# switches users to nobody:nogroup and tests:tests (made by scripts/install-deps.sh).
# Must run as root. A FUSE mount under test needs allow_other (tests run as nobody/tests)
# and should use default_permissions.
set -euo pipefail

me="pjdfstest.sh"
usage() {
    sed -n '4,17p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() {
    echo "$me: error: $*" >&2
    exit 2
}

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
expect_file=""
log=""
secondary=""
naptime="0.01"
config=""
timeout_s=1800
allow_skips=0
dir=""
patterns=()

while [ $# -gt 0 ]; do
    case "$1" in
        --expect-file) expect_file="${2:?--expect-file needs a file}"; shift 2 ;;
        --log) log="${2:?--log needs a file}"; shift 2 ;;
        --secondary-fs) secondary="${2:?--secondary-fs needs a directory}"; shift 2 ;;
        --naptime) naptime="${2:?--naptime needs seconds}"; shift 2 ;;
        --config) config="${2:?--config needs a file}"; shift 2 ;;
        --timeout) timeout_s="${2:?--timeout needs seconds}"; shift 2 ;;
        --allow-skips) allow_skips=1; shift ;;
        -h | --help) usage ;;
        --) shift; patterns=("$@"); break ;;
        -*) echo "$me: unknown option $1" >&2; usage ;;
        *)
            [ -z "$dir" ] || { echo "$me: more than one DIR given" >&2; usage; }
            dir="$1"
            shift
            ;;
    esac
done
[ -n "$dir" ] || usage
[ -d "$dir" ] || die "$dir is not a directory"
dir="$(cd "$dir" && pwd)"
[ "$(id -u)" = 0 ] || die "must run as root (pjdfstest switches users and makes device nodes)"
[ -z "$expect_file" ] || [ -f "$expect_file" ] || die "expect file $expect_file not found"
[ -z "$config" ] || [ -f "$config" ] || die "config $config not found"

# $PJDFSTEST, else where scripts/install-deps.sh puts it, else $PATH
pjd="${PJDFSTEST:-${CARGO_HOME:-${HOME:-/root}/.cargo}/bin/pjdfstest}"
[ -x "$pjd" ] || pjd="$(command -v pjdfstest 2>/dev/null || true)"
if [ -z "$pjd" ] || [ ! -x "$pjd" ]; then die "pjdfstest not found (run scripts/install-deps.sh)"; fi

work="$(mktemp -d -t pjdfstest-sh.XXXXXX)"
made_secondary=""
cleanup() {
    rm -rf "$work"
    if [ -n "$made_secondary" ]; then rm -rf "$made_secondary"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "$secondary" ]; then
    made_secondary="$(mktemp -d /dev/shm/pjdfstest-xdev.XXXXXX)"
    secondary="$made_secondary"
fi
[ -d "$secondary" ] || die "secondary fs $secondary is not a directory"
if [ "$(stat -c %d "$secondary")" = "$(stat -c %d "$dir")" ]; then
    die "secondary fs $secondary is on the same filesystem as $dir (EXDEV tests need another one)"
fi

# The tests switch to nobody and tests: they must reach DIR (a FUSE mount needs allow_other,
# and every parent directory needs o+x).
for u in nobody tests; do
    getent passwd "$u" >/dev/null || die "user $u missing (run scripts/install-deps.sh)"
    if ! setpriv --reuid="$u" --regid="$(id -g "$u")" --clear-groups -- stat "$dir" >/dev/null 2>&1; then
        die "user $u cannot reach $dir: a FUSE mount needs allow_other, and every parent needs o+x"
    fi
done

if [ -z "$config" ]; then
    config="$work/pjdfstest.toml"
    cat >"$config" <<EOF
# generated by scripts/pjdfstest.sh
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = $naptime
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["tests", "tests"]]
EOF
fi

if [ -z "$log" ]; then
    mkdir -p "$repo_root/target/pjdfstest"
    log="$repo_root/target/pjdfstest/pjdfstest-$(date +%Y%m%d-%H%M%S).log"
else
    mkdir -p "$(dirname "$log")"
fi

version="$("$pjd" --version 2>/dev/null | awk '{print $2}')"
echo "$me: pjdfstest $version in $dir (secondary fs $secondary, naptime $naptime)"
echo "$me: raw log: $log"

before="$(find "$dir" -mindepth 1 -maxdepth 1 | wc -l)"
rc=0
(
    cd /
    NO_COLOR=1 CLICOLOR=0 RUST_BACKTRACE=0 exec timeout --kill-after=30 "$timeout_s" \
        "$pjd" -c "$config" -p "$dir" -s "$secondary" "${patterns[@]}"
) >"$log" 2>&1 </dev/null || rc=$?

summary="$(grep -E '^Summary: ' "$log" | tail -n 1 || true)"
if [ -z "$summary" ]; then
    tail -n 20 "$log" >&2
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        die "pjdfstest timed out after ${timeout_s}s (exit $rc); see $log"
    fi
    die "pjdfstest printed no summary (exit $rc); see $log"
fi

after="$(find "$dir" -mindepth 1 -maxdepth 1 | wc -l)"
if [ "$after" -gt "$before" ]; then
    echo "$me: warning: pjdfstest left $((after - before)) entr(y/ies) in $dir (its cleanup failed there)"
fi

# One line per test: STATUS<TAB>NAME<TAB>first message line (failure message or skip reason).
awk '
    function flush() { if (name != "") print status "\t" name "\t" msg; name = "" }
    /^[^ \t]+::[^ \t]+ +(ok|FAILED|skipped|failed as expected|PASSED UNEXPECTEDLY)$/ {
        flush()
        name = $1
        line = $0
        sub(/^[^ \t]+ +/, "", line)
        status = line
        if (status == "failed as expected") status = "FAILED"
        if (status == "PASSED UNEXPECTEDLY") status = "ok"
        msg = ""
        next
    }
    /^\t/ && name != "" && msg == "" { msg = $0; sub(/^\t+/, "", msg); next }
    /^Summary: / { flush() }
    END { flush() }
' "$log" >"$work/results.tsv"

expected="$work/expected.txt"
: >"$expected"
if [ -n "$expect_file" ]; then
    sed 's/#.*//' "$expect_file" | awk 'NF { print $1 }' | sort -u >"$expected"
fi
is_expected() { grep -qxF -- "$1" "$expected"; }

n() { awk -F'\t' -v s="$1" '$1 == s' "$work/results.tsv" | wc -l; }
failed=$(n FAILED)
passed=$(n ok)
skipped=$(n skipped)
# pjdfstest's own counts are authoritative; warn if our parse disagrees
read -r s_failed s_skipped s_passed s_total < <(
    echo "$summary" | sed -E 's/^Summary: ([0-9]+) failed, ([0-9]+) skipped, ([0-9]+) passed, ([0-9]+) expected failures, ([0-9]+) total.*/\1 \2 \3 \5/'
)
if [ "$s_failed" != "$failed" ] || [ "$s_passed" != "$passed" ] || [ "$s_skipped" != "$skipped" ]; then
    echo "$me: warning: parsed $failed/$passed/$skipped but pjdfstest says: $summary" >&2
fi

unexpected_failures=0
unexpected_skips=0
echo "$me: $s_failed failed, $s_passed passed, $s_skipped skipped, $s_total total"

if [ "$failed" -gt 0 ]; then
    echo "$me: failing tests ($failed):"
    while IFS=$'\t' read -r status name msg; do
        [ "$status" = FAILED ] || continue
        if is_expected "$name"; then
            tag="expected  "
        else
            tag="UNEXPECTED"
            unexpected_failures=$((unexpected_failures + 1))
        fi
        printf '  %s %-48s %s\n' "$tag" "$name" "$msg"
    done <"$work/results.tsv"
fi

# Skips explained by the configuration (no remounting) are normal; any other skip
# means a test did not run here (a guard failed) and must be listed as expected.
other_skips="$(awk -F'\t' '$1 == "skipped" && $3 !~ /allow_remount/' "$work/results.tsv")"
if [ -n "$other_skips" ]; then
    echo "$me: skipped for a reason other than the configuration:"
    while IFS=$'\t' read -r _ name msg; do
        if is_expected "$name"; then
            tag="expected  "
        else
            tag="UNEXPECTED"
            unexpected_skips=$((unexpected_skips + 1))
        fi
        printf '  %s %-48s %s\n' "$tag" "$name" "$msg"
    done <<<"$other_skips"
fi

# Entries of the expect file that passed now: candidates for removal.
now_passing=0
while IFS=$'\t' read -r status name _; do
    if [ "$status" = ok ] && is_expected "$name"; then
        [ "$now_passing" -gt 0 ] || echo "$me: listed in $expect_file but passing now (remove them):"
        echo "  $name"
        now_passing=$((now_passing + 1))
    fi
done <"$work/results.tsv"

echo "$me: RESULT failed=$s_failed passed=$s_passed skipped=$s_skipped total=$s_total" \
    "unexpected_failures=$unexpected_failures unexpected_skips=$unexpected_skips"

if [ "$unexpected_failures" -gt 0 ]; then
    echo "$me: FAIL: $unexpected_failures unexpected failure(s); details in $log"
    exit 1
fi
if [ "$unexpected_skips" -gt 0 ] && [ "$allow_skips" = 0 ]; then
    echo "$me: FAIL: $unexpected_skips unexpected skip(s) (list them in the expect file or pass --allow-skips)"
    exit 1
fi
echo "$me: OK"
