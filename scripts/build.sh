#!/usr/bin/env bash
# cargo build --release, never silent for long: a line every 10 s saying how long it has been
# building, how many crates are done and which one is compiling (the last crate, smithfs itself,
# compiles for a minute or more with no word from cargo). On failure the end of cargo's output is printed and the exit code is cargo's.
#
# Usage: scripts/build.sh [CARGO BUILD ARGS…]     (run from anywhere; builds this repository)
# Environment: BUILD_PROGRESS_SECS  seconds between progress lines (default 10)
set -euo pipefail
every=${BUILD_PROGRESS_SECS:-10}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
command -v cargo >/dev/null || { echo "build: cargo is missing (https://rustup.rs)" >&2; exit 1; }

log=$(mktemp "${TMPDIR:-/tmp}/smithfs-build.XXXXXX")
trap 'rm -f "$log"' EXIT
start=$SECONDS
echo "build: cargo build --release $* (a first build compiles about 150 crates: a few minutes)"
(cd "$REPO" && exec cargo build --release --color never "$@") >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; rm -f "$log"' INT TERM
last=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if [ $((SECONDS - last)) -ge "$every" ]; then
        last=$SECONDS
        n=$(grep -c '^ *Compiling ' "$log" || :)
        cur=$(grep '^ *Compiling ' "$log" | tail -n 1 | awk '{ print $2, $3 }' || :)
        echo "build: $((SECONDS - start)) s, $n crates compiled${cur:+, now compiling $cur}"
    fi
done
rc=0
wait "$pid" || rc=$?
if [ "$rc" != 0 ]; then
    tail -n 40 "$log" >&2
    echo "build: cargo build --release failed (exit $rc)" >&2
    exit "$rc"
fi
grep -E '^(warning|error)' "$log" >&2 || :
echo "build: done in $((SECONDS - start)) s: $REPO/target/release/smithfs"
