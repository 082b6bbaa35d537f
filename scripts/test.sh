#!/usr/bin/env bash
# Everything CI runs, top to bottom (.ci/run execs this):
#   deps       scripts/install-deps.sh (apt fuse3/libacl1-dev/bindfs..., cargo install pjdfstest, users,
#              the real agent CLIs that tests/e2e/agent_clis.rs runs: npm and pip into target/)
#   fmt        cargo fmt --check
#   refs       scripts/check-spec-refs.sh: every `§N` cited in the repository is a section of
#              docs/SPEC.md, and none names the old contract file outside the repository
#   clippy     cargo clippy --all-targets -- -D warnings
#   docs       RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib (no broken intra-doc link)
#   build      cargo build --release
#   tests      cargo nextest run --release (cargo test --release without nextest), plus doctests
#              and tests/agent_reference.sh;
#              .config/nextest.toml retries a failed integration test once and reports it FLAKY
#   pjdfstest  smithfs init + mount --allow-other on a temp dir, scripts/pjdfstest.sh as root in
#              DIR/pjdfstest through the mount, smithfs umount (a trap unmounts on any failure)
#   uring      (root, kernel with FUSE over io_uring) the test binaries fs (no kernel) and mount
#              (core_fs, isolation) again with SMITHFS_TEST_TRANSPORT=io-uring, then pjdfstest over
#              `mount --transport io-uring`; the machine-wide enable_uring switch is on only
#              while those mounts start, and put back as found
#   demos      (root) both demos exactly as a user runs them, from the checkout: `scripts/demo.sh`
#              (the census; its tree stays in ./.agent-smith-demo, as for a user) and
#              `scripts/demo.sh --coding-only`, and `scripts/demo.sh --slurm --coding` (the census,
#              then the coding edition, with every run a Slurm job on one throwaway cluster); each
#              one's output goes to target/test-sh/demo*.log
#              and its exit status is the verdict (the end of the log is shown on a failure)
# Ends with one line, `test.sh: PASS — ...` or `test.sh: FAIL — <stage(s)>`, and exits 0 or 1.
# fmt, clippy and tests failing do not stop the later stages; deps or build failing does.
#
# Environment:
#   TEST_SH_ONLY="fmt clippy ..."   run only these stages (deps and build always run when a
#                                   later stage needs them)
#   SMITHFS_TEST_FS=bindfs          run the pjdfstest stage on a bindfs mount instead of smithfs
#                                   (to test this script; smithfs is the default)
#   PJDFSTEST_TIMEOUT=SECS          limit for the pjdfstest run (default 1800)
#   PJDFSTEST_EXPECT_FILE=F         expected failures (default tests/pjdfstest-expected-failures.txt)
# Functions here are called through traps and run_stage, which shellcheck cannot follow:
# shellcheck disable=SC2317
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$(pwd)"
logdir="$root/target/test-sh"
mkdir -p "$logdir"

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export PATH="${CARGO_HOME:-${HOME:-/root}/.cargo}/bin:$PATH"
test_fs="${SMITHFS_TEST_FS:-smithfs}"
only="${TEST_SH_ONLY:-}"

start=$SECONDS
current="startup"
failed_stages=()
notes=()
tests_passed=0
tests_failed=0
tests_skipped=0
tests_flaky=0
pjd_passed=0
pjd_failed=0
pjd_skipped=0
pjd_counts=""
pjd_transport=dev-fuse
uring_param=/sys/module/fuse/parameters/enable_uring
uring_counts=""
summary_printed=0

# pjdfstest stage state, for the trap
mnt=""
work=""
bindfs_pid=""

wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }

is_mounted() { [ -n "$1" ] && findmnt -rn --mountpoint "$1" >/dev/null 2>&1; }

unmount_all() {
    if is_mounted "$mnt"; then
        echo "test.sh: unmounting $mnt"
        if [ "$test_fs" = smithfs ]; then
            timeout 60 target/release/smithfs umount "$mnt" || true
        fi
        if is_mounted "$mnt"; then umount "$mnt" 2>/dev/null || true; fi
        if is_mounted "$mnt"; then fusermount3 -u "$mnt" 2>/dev/null || true; fi
        if is_mounted "$mnt"; then
            echo "test.sh: $mnt still busy: lazy unmount"
            umount -l "$mnt" || true
        fi
    fi
    if [ -n "$bindfs_pid" ] && kill -0 "$bindfs_pid" 2>/dev/null; then
        kill "$bindfs_pid" 2>/dev/null || true
    fi
    bindfs_pid=""
    # only remove the temp tree once nothing is mounted on it (it is the backing store)
    if [ -n "$work" ] && ! is_mounted "$mnt"; then
        rm -rf "$work"
        work=""
    fi
}

finish() {
    local rc=$?
    unmount_all
    if [ "$summary_printed" = 0 ]; then
        echo "test.sh: FAIL — $current (aborted with exit $rc after $((SECONDS - start))s)"
        [ "$rc" != 0 ] || rc=1
    fi
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# run_stage NAME CMD...: prints the stage's timing; returns CMD's status.
run_stage() {
    local name="$1" t0=$SECONDS rc=0
    shift
    current="$name"
    echo
    echo "=== test.sh: $name: $*"
    "$@" || rc=$?
    if [ "$rc" = 0 ]; then
        echo "=== test.sh: $name ok ($((SECONDS - t0))s)"
    else
        echo "=== test.sh: $name FAILED with exit $rc ($((SECONDS - t0))s)"
        failed_stages+=("$name")
    fi
    return "$rc"
}

# --- stage bodies --------------------------------------------------------------
# They run where errexit is off (inside `||`): every step checks its own status.

# sum_counts FILE LINE_REGEX WORD: adds up "N WORD" over the lines of FILE matching LINE_REGEX
sum_counts() {
    grep -E "$2" "$1" 2>/dev/null | grep -oE "[0-9]+ $3" | awk '{ s += $1 } END { print s + 0 }'
}

# The demos as a user runs them (issue 25: their own tests ran the job, not the scripts, so an
# exit 141 of the script itself went unseen). Output to a file each; the exit status decides.
demo_counts=""
stage_demos() {
    local rc=0 name log r summary
    for name in demo demo-coding demo-slurm; do
        log="$logdir/$name.log"
        r=0
        case $name in
            demo) scripts/demo.sh >"$log" 2>&1 </dev/null || r=$? ;;
            demo-coding) scripts/demo.sh --coding-only >"$log" 2>&1 </dev/null || r=$? ;;
            # every run a Slurm job on a throwaway one-node cluster the demo starts and stops:
            # the census, then the coding edition on the same cluster
            demo-slurm) env -u SLURM_CONF scripts/demo.sh --slurm --coding >"$log" 2>&1 </dev/null || r=$? ;;
        esac
        # the demo's own summary: its wall time and its check
        summary="$(grep -E '^demo(-coding)?: (wall time|check):' "$log" | sed -E 's/^demo(-coding)?: +//; s/ +/ /g' |
            awk '{ printf "%s%s", (NR > 1 ? "; " : ""), $0 }' || true)"
        if [ "$r" = 0 ]; then
            echo "test.sh: $name ok: $summary (log: $log)"
            demo_counts+="$name ok, "
        else
            echo "test.sh: $name FAILED with exit $r (log: $log); its last lines:"
            tail -n 25 "$log" | sed 's/^/    /'
            demo_counts+="$name FAILED (exit $r), "
            rc=1
        fi
    done
    demo_counts="${demo_counts%, }"
    return "$rc"
}

stage_tests() {
    local log="$logdir/tests.log" rc=0
    # install-deps.sh installs fsx; when it is there, the fsx test must run, not skip.
    if command -v fsx >/dev/null 2>&1; then export SMITHFS_REQUIRE_FSX=1; fi
    if cargo nextest --version >/dev/null 2>&1; then
        cargo nextest run --release --no-fail-fast --no-tests=warn 2>&1 | tee "$log" || rc=$?
        tests_passed="$(sum_counts "$log" '^ *Summary \[' passed)"
        tests_failed="$(sum_counts "$log" '^ *Summary \[' failed)"
        tests_skipped="$(sum_counts "$log" '^ *Summary \[' skipped)"
        tests_flaky="$(sum_counts "$log" '^ *Summary \[' flaky)"
        if [ -f src/lib.rs ]; then # nextest does not run doctests
            cargo test --release --doc 2>&1 | tee "$log.doc" || rc=$?
            tests_passed=$((tests_passed + $(sum_counts "$log.doc" '^test result:' passed)))
            tests_failed=$((tests_failed + $(sum_counts "$log.doc" '^test result:' failed)))
            tests_skipped=$((tests_skipped + $(sum_counts "$log.doc" '^test result:' ignored)))
        fi
    else
        cargo test --release --no-fail-fast 2>&1 | tee "$log" || rc=$?
        tests_passed="$(sum_counts "$log" '^test result:' passed)"
        tests_failed="$(sum_counts "$log" '^test result:' failed)"
        tests_skipped="$(sum_counts "$log" '^test result:' ignored)"
    fi
    # The agents' shell tests: tests/agent_configs.sh runs inside tests/e2e/agent_clis.rs; the
    # reference agent's own test runs here (a plain directory, no mount).
    if bash tests/agent_reference.sh >"$log.agent_reference" 2>&1; then
        tests_passed=$((tests_passed + 1))
    else
        rc=1
        tests_failed=$((tests_failed + 1))
        echo "tests/agent_reference.sh failed: see $log.agent_reference"
    fi
    return "$rc"
}

mount_fs() {
    if [ "$test_fs" = smithfs ]; then
        timeout 120 target/release/smithfs init "$mnt" || return 1
        # pjdfstest switches to uids of its own; with the sandbox on they are Unknown (docs/SPEC.md
        # §2, §12), so the conformance run is of the mount without it
        python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["sandbox"] = {"enabled": False}; json.dump(c, open(p, "w"), indent=2)' \
            "$mnt/config.json" || return 1
        if [ "$pjd_transport" = io-uring ]; then
            local was r=0
            was="$(cat "$uring_param")"
            echo 1 >"$uring_param"
            timeout 120 target/release/smithfs mount "$mnt" --allow-other --transport io-uring || r=1
            case "$was" in Y | y | 1) echo 1 >"$uring_param" ;; *) echo 0 >"$uring_param" ;; esac
            [ $r = 0 ] || return 1
        else
            timeout 120 target/release/smithfs mount "$mnt" --allow-other --transport dev-fuse || return 1
        fi
    elif [ "$test_fs" = bindfs ]; then
        mkdir -p "$work/store" || return 1
        # -f keeps bindfs in the foreground so that we know (and later kill only) its pid
        bindfs -f -o allow_other,default_permissions "$work/store" "$mnt" &
        bindfs_pid=$!
        for _ in $(seq 1 100); do
            is_mounted "$mnt" && break
            kill -0 "$bindfs_pid" 2>/dev/null || break
            sleep 0.1
        done
    else
        echo "test.sh: unknown SMITHFS_TEST_FS=$test_fs (smithfs or bindfs)" >&2
        return 1
    fi
    if ! is_mounted "$mnt"; then
        echo "test.sh: $test_fs did not mount $mnt" >&2
        return 1
    fi
    findmnt -rn -o TARGET,FSTYPE,OPTIONS --mountpoint "$mnt"
}

stage_pjdfstest() {
    local out="$logdir/pjdfstest-$pjd_transport.out" rc=0 result
    # the users pjdfstest switches to must reach the mount: 0755 all the way down
    work="$(mktemp -d /tmp/smithfs-pjdfstest.XXXXXX)" || return 1
    chmod 0755 "$work" || return 1
    mnt="$work/mnt"
    mkdir -p "$mnt" || return 1
    mount_fs || return 1
    mkdir "$mnt/pjdfstest" || return 1
    scripts/pjdfstest.sh --expect-file "${PJDFSTEST_EXPECT_FILE:-tests/pjdfstest-expected-failures.txt}" \
        --timeout "${PJDFSTEST_TIMEOUT:-1800}" --log "$logdir/pjdfstest-$test_fs-$pjd_transport.log" \
        "$mnt/pjdfstest" 2>&1 | tee "$out" || rc=$?
    result="$(grep -E '^pjdfstest.sh: RESULT ' "$out" | tail -n 1 || true)"
    if [ -n "$result" ]; then
        local f p s t u k
        f="$(sed -E 's/.* failed=([0-9]+).*/\1/' <<<"$result")"
        p="$(sed -E 's/.* passed=([0-9]+).*/\1/' <<<"$result")"
        s="$(sed -E 's/.* skipped=([0-9]+).*/\1/' <<<"$result")"
        t="$(sed -E 's/.* total=([0-9]+).*/\1/' <<<"$result")"
        u="$(sed -E 's/.* unexpected_failures=([0-9]+).*/\1/' <<<"$result")"
        k="$(sed -E 's/.* unexpected_skips=([0-9]+).*/\1/' <<<"$result")"
        pjd_passed="$p"
        pjd_failed="$f"
        pjd_skipped="$s"
        if [ "$f" = 0 ]; then
            pjd_counts="$p/$t passed ($s skipped, 0 unexpected failures"
        else
            pjd_counts="$p/$t passed ($s skipped, $f failed, $u unexpected failures"
        fi
        [ "$k" = 0 ] || pjd_counts+=", $k unexpected skips"
        pjd_counts+=")"
        [ "$test_fs" = smithfs ] || pjd_counts+=" on $test_fs"
    fi
    # leave the mount the way a user would
    if [ "$test_fs" = smithfs ]; then
        timeout 60 target/release/smithfs umount "$mnt" || {
            echo "test.sh: smithfs umount failed" >&2
            rc=1
        }
    fi
    unmount_all
    return "$rc"
}

# The mount suites and pjdfstest again over FUSE over io_uring (issue 14).
stage_uring() {
    local log="$logdir/tests-uring.log" rc=0 p f s
    SMITHFS_TEST_TRANSPORT=io-uring cargo nextest run --release --no-fail-fast \
        --test fs --test mount 2>&1 | tee "$log" || rc=$?
    p="$(sum_counts "$log" '^ *Summary \[' passed)"
    f="$(sum_counts "$log" '^ *Summary \[' failed)"
    s="$(sum_counts "$log" '^ *Summary \[' skipped)"
    tests_passed=$((tests_passed + p))
    tests_failed=$((tests_failed + f))
    tests_skipped=$((tests_skipped + s))
    uring_counts="$p tests passed, $f failed"
    # pjdfstest: its counts replace the /dev/fuse run's in the totals only when that did not run
    local dp=$pjd_passed df=$pjd_failed ds=$pjd_skipped dc=$pjd_counts
    pjd_passed=0 pjd_failed=0 pjd_skipped=0 pjd_counts=""
    pjd_transport=io-uring
    stage_pjdfstest || rc=$?
    pjd_transport=dev-fuse
    uring_counts+=", pjdfstest ${pjd_counts:-gave no result}"
    pjd_passed=$((dp + pjd_passed)) pjd_failed=$((df + pjd_failed)) pjd_skipped=$((ds + pjd_skipped))
    pjd_counts=$dc
    return "$rc"
}

# --- run -------------------------------------------------------------------------

echo "test.sh: $(date -u +%FT%TZ) on $(uname -sr), $(nproc) cores; logs in $logdir"

run_stage deps scripts/install-deps.sh || {
    current="deps"
    exit 1
}

if wanted fmt; then run_stage fmt cargo fmt --check || true; fi
if wanted refs; then run_stage refs scripts/check-spec-refs.sh || true; fi
if wanted clippy; then run_stage clippy cargo clippy --all-targets -- -D warnings || true; fi
if wanted docs; then
    run_stage docs env RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --quiet || true
fi

if wanted build || wanted tests || wanted pjdfstest || wanted uring || wanted demos; then
    if ! run_stage build cargo build --release; then
        current="build"
        exit 1
    fi
fi

if wanted tests; then run_stage tests stage_tests || true; fi

if wanted pjdfstest; then
    if [ "$(id -u)" != 0 ]; then
        echo "test.sh: pjdfstest needs root; skipping it" >&2
        notes+=("pjdfstest skipped (not root)")
    else
        run_stage pjdfstest stage_pjdfstest || true
    fi
fi

if wanted uring; then
    if [ "$(id -u)" != 0 ] || [ ! -w "$uring_param" ]; then
        notes+=("io_uring stage skipped (needs root and a kernel with CONFIG_FUSE_IO_URING)")
    else
        run_stage uring stage_uring || true
    fi
fi

if wanted demos; then
    if [ "$(id -u)" != 0 ]; then
        notes+=("demos skipped (not root: the coding demo's workspaces need a root daemon)")
    else
        run_stage demos stage_demos || true
    fi
fi

current="summary"
parts=()
if wanted fmt; then
    if [[ " ${failed_stages[*]} " == *" fmt "* ]]; then parts+=("fmt FAILED"); else parts+=("fmt ok"); fi
fi
if wanted clippy; then
    if [[ " ${failed_stages[*]} " == *" clippy "* ]]; then parts+=("clippy FAILED"); else parts+=("clippy ok"); fi
fi
if wanted docs; then
    if [[ " ${failed_stages[*]} " == *" docs "* ]]; then parts+=("docs FAILED"); else parts+=("docs ok"); fi
fi
if wanted refs; then
    if [[ " ${failed_stages[*]} " == *" refs "* ]]; then parts+=("spec citations FAILED"); else parts+=("spec citations ok"); fi
fi
if wanted tests; then
    if [[ " ${failed_stages[*]} " == *" tests "* ]]; then
        parts+=("tests FAILED ($tests_failed failed, $tests_passed passed)")
    else
        if [ "$tests_flaky" -gt 0 ]; then
            parts+=("$tests_passed tests passed ($tests_flaky flaky: passed on a retry, see FLAKY in the log)")
        else
            parts+=("$tests_passed tests passed")
        fi
    fi
fi
if wanted pjdfstest && [ "$(id -u)" = 0 ]; then
    if [ -n "$pjd_counts" ]; then
        parts+=("pjdfstest $pjd_counts")
    else
        parts+=("pjdfstest gave no result (mount or setup failed, see above)")
    fi
fi
if [ -n "$uring_counts" ]; then
    if [[ " ${failed_stages[*]} " == *" uring "* ]]; then
        parts+=("io_uring FAILED ($uring_counts)")
    else
        parts+=("io_uring: $uring_counts")
    fi
fi
if [ -n "$demo_counts" ]; then parts+=("demos: $demo_counts"); fi
parts+=("${notes[@]}")
detail="$(printf '%s, ' "${parts[@]}")"
detail="${detail%, }"
elapsed="$((SECONDS - start))s"

# the plain count line that CI reads: cargo tests and pjdfstest cases together
echo "tests: $((tests_passed + pjd_passed)) passed, $((tests_failed + pjd_failed)) failed, $((tests_skipped + pjd_skipped)) skipped"
if [ "${#failed_stages[@]}" = 0 ]; then
    echo "test.sh: PASS — $detail; ${elapsed}"
    summary_printed=1
    exit 0
fi
echo "test.sh: FAIL — ${failed_stages[*]}; ${detail}; ${elapsed}"
summary_printed=1
exit 1
