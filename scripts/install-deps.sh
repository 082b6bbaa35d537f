#!/usr/bin/env bash
# Install what smithfs's build, tests and pjdfstest need on a Debian 12 machine.
#
# Idempotent: checks first, installs only what is missing, prints nothing when
# everything is already there (pass -v to hear about it anyway). Needs root for
# the apt and user steps (uses sudo when not root and sudo exists).
#
# What it ensures:
#   - apt: fuse3 (fusermount3), libfuse3-dev + pkg-config (benchmarks, libfuse
#     comparison), libacl1-dev + acl (pjdfstest builds against libacl), bindfs
#     (a reference FUSE filesystem for comparisons)
#   - pjdfstest (crates.io, pinned version) in ${CARGO_HOME:-$HOME/.cargo}/bin
#   - fsx, the file system exerciser (crates.io, pinned), in the same place; a
#     failed fsx install is a warning (tests/reliability.rs then skips fsx)
#   - the users/groups pjdfstest switches to: nobody:nogroup (Debian) and tests:tests
#
# Environment:
#   PJDFSTEST_VERSION   crate version to install (default below)
#   FSX_VERSION         crate version of fsx to install (default below)
#   CARGO_HOME          where cargo installs binaries (default ~/.cargo)
set -euo pipefail

PJDFSTEST_VERSION="${PJDFSTEST_VERSION:-0.2.2}"
FSX_VERSION="${FSX_VERSION:-0.3.2}"
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config libacl1-dev acl bindfs)

verbose=0
case "${1:-}" in
    -v | --verbose) verbose=1 ;;
    -h | --help)
        sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    "") ;;
    *)
        echo "install-deps.sh: unknown argument '$1' (usage: install-deps.sh [-v])" >&2
        exit 2
        ;;
esac

say() { echo "install-deps: $*"; }
vsay() { if [ "$verbose" = 1 ]; then say "$@"; fi; }
die() {
    echo "install-deps: error: $*" >&2
    exit 1
}

SUDO=()
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO=(sudo)
    else
        die "must run as root (or with sudo available)"
    fi
fi

# --- apt packages ----------------------------------------------------------
is_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    is_installed "$pkg" || missing+=("$pkg")
done
# a C toolchain is needed by cargo install (pjdfstest links libacl)
command -v cc >/dev/null 2>&1 || missing+=(build-essential)

if [ "${#missing[@]}" -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # other processes may hold the dpkg lock for a while: wait instead of failing
    apt_opts=(-q -o DPkg::Lock::Timeout=600)
    log="$(mktemp -t install-deps-apt.XXXXXX.log)"
    if ! { "${SUDO[@]}" apt-get "${apt_opts[@]}" update &&
        "${SUDO[@]}" apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "apt-get install ${missing[*]} failed (full log: $log)"
    fi
    rm -f "$log"
else
    vsay "apt packages present: ${APT_PACKAGES[*]}"
fi

# --- pjdfstest ---------------------------------------------------------------
cargo_home="${CARGO_HOME:-${HOME:-/root}/.cargo}"
cargo_bin="$cargo_home/bin"
pjd="$cargo_bin/pjdfstest"
have_version=""
if [ -x "$pjd" ]; then
    have_version="$("$pjd" --version 2>/dev/null | awk '{print $2}')" || have_version=""
fi
if [ "$have_version" != "$PJDFSTEST_VERSION" ]; then
    command -v cargo >/dev/null 2>&1 || die "cargo not found in PATH"
    say "cargo install pjdfstest $PJDFSTEST_VERSION (about 1-2 minutes)"
    log="$(mktemp -t pjdfstest-install.XXXXXX.log)"
    if ! nice -n 10 cargo install pjdfstest --locked --force --version "=$PJDFSTEST_VERSION" \
        --root "$cargo_home" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        die "cargo install pjdfstest failed (full log: $log)"
    fi
    rm -f "$log"
else
    vsay "pjdfstest $have_version present at $pjd"
fi

# --- fsx ---------------------------------------------------------------------
fsx="$cargo_bin/fsx"
have_fsx=""
if [ -x "$fsx" ]; then
    have_fsx="$("$fsx" --version 2>/dev/null | awk '{print $2}')" || have_fsx=""
fi
if [ "$have_fsx" != "$FSX_VERSION" ]; then
    say "cargo install fsx $FSX_VERSION (about a minute)"
    log="$(mktemp -t fsx-install.XXXXXX.log)"
    if nice -n 10 cargo install fsx --locked --force --version "=$FSX_VERSION" \
        --root "$cargo_home" >"$log" 2>&1; then
        rm -f "$log"
    else
        tail -n 20 "$log" >&2
        say "warning: cargo install fsx failed (full log: $log); the fsx test will skip"
    fi
else
    vsay "fsx $have_fsx present at $fsx"
fi

# --- users and groups pjdfstest switches to ----------------------------------
# Debian's nobody has primary group nogroup (65534); pjdfstest.sh's config names
# [nobody, nogroup] and [tests, tests], and pjdfstest checks that each user's
# primary group is the group given.
getent group nogroup >/dev/null || "${SUDO[@]}" groupadd --system nogroup
if ! getent passwd nobody >/dev/null; then
    say "creating user nobody"
    "${SUDO[@]}" useradd --system --gid nogroup --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin nobody
fi
[ "$(id -gn nobody)" = nogroup ] ||
    die "user nobody's primary group is $(id -gn nobody), pjdfstest.sh expects nogroup"
if ! getent group tests >/dev/null; then
    say "creating group tests"
    "${SUDO[@]}" groupadd --system tests
fi
if ! getent passwd tests >/dev/null; then
    say "creating user tests"
    "${SUDO[@]}" useradd --system --gid tests --no-create-home --home-dir / \
        --shell /usr/sbin/nologin --comment "Dummy user for pjdfstest" tests
fi
[ "$(id -gn tests)" = tests ] ||
    die "user tests's primary group is $(id -gn tests), pjdfstest expects tests"

# --- kernel side: report only, nothing to install ----------------------------
if [ ! -c /dev/fuse ]; then
    "${SUDO[@]}" modprobe fuse 2>/dev/null || true
    [ -c /dev/fuse ] || say "warning: /dev/fuse is missing; FUSE mounts will fail"
fi

vsay "all dependencies present"
