#!/usr/bin/env bash
# Measure smithfs against native ext4, bindfs and libfuse's passthrough_ll in one run (issue 5).
#
# Usage: scripts/bench.sh [--quick] [--only WORKLOAD...] [--fs FS,...] [--reps N] [--out F] [--no-build]
#                        [--hook-identity MODE] [--hook-transport MODE] [--hook-samples N]
#                        [--disk dir|image]
#
#   --quick        fewer and smaller operations, one repetition (a few minutes)
#   --only W...    only these workloads (names below); stat/read make their files untimed when
#                  create is not run, rm untars its tree untimed when untar is not run; rmcold
#                  untars its own tree untimed, drops the caches, then times rm -rf (issue 25)
#   --fs LIST      only these filesystems, comma-separated (native, the baseline, always runs)
#   --reps N       repetitions (default 3; --quick 1); tables show medians
#   --disk image   each filesystem on its own fresh ext4 image (see below); default dir
#   --out F        the Markdown report (default target/bench/results.md); the raw records go
#                  next to it as F.tsv (F without .md)
#   --no-build     use the existing release binary ($SMITHFS, else the cargo target dir)
#   --hook-identity MODE   mount the hook workload with --identity MODE (auto|cgroup|ancestry;
#                  default: the mount's default, auto)
#   --hook-transport MODE  mount the hook workload with --transport MODE (auto|io-uring|dev-fuse;
#                  default auto, which is dev-fuse unless enable_uring is on; io-uring switches
#                  enable_uring on for its INIT like the io_uring columns)
#   --hook-samples N   inbox tasks timed by the hook workload (default 40; --quick 10)
#   Hook latency alone, e.g.: scripts/bench.sh --only hook --fs native --hook-identity ancestry
#
# Workloads: create stat read untar rm rmcold seqwrite seqread git gitst par rm30k cp pip hook rss
#            latency
#   latency  request latency: N x statx(AT_STATX_FORCE_SYNC) of one file, each timed (on FUSE one
#            GETATTR round trip each: the kernel's attribute cache is bypassed); p50/p99/max µs
# Filesystems: native op smith nopt bindfs pll phd phu opu smithu
#   native  a plain directory on the root ext4 filesystem
#   op      smithfs (kernel passthrough on, --transport dev-fuse), workloads run as the operator
#   smith   smithfs (--transport dev-fuse), workloads run bound to smith-root (`smithfs run
#           --smith smith-root`); as the operator, and marked so, when this build has no `smithfs run`
#   opu, smithu  like op and smith, over FUSE over io_uring (--transport io-uring)
#   phd     libfuse's passthrough_hp (the anchor binary $PASSTHROUGH_HP, default
#           ../shared/anchors/passthrough_hp beside the repo), classic /dev/fuse transport
#   phu     passthrough_hp -o io_uring
#   The io_uring mounts switch /sys/module/fuse/parameters/enable_uring on only while they
#   mount (their INIT negotiates it) and put back the value found at once.
#   nopt    smithfs --no-passthrough, as the operator
#   remote  smithfs (--transport dev-fuse) with launcher.kind loopback: each workload is a run of
#           smith-root, i.e. `smithfs attach` on this host, reaching the tree through its own
#           remote mount over TLS on 127.0.0.1 (docs/SPEC.md §13; not in the default set)
#   remoteb like remote, with the binary $SMITHFS_B (A/B a remote-mount change side by side, the
#           daemon and its attach both B's; not in the default set)
#   opb     like op, with the binary $SMITHFS_B (A/B a change side by side; not in the default set)
#   smithub like smithu, with the binary $SMITHFS_B (A/B over io_uring; not in the default set)
#   bindfs  bindfs (Debian package), plain, as root
#   pll     libfuse's example passthrough_ll (built here from libfuse3-dev's examples; no
#           kernel passthrough; its defaults: multi-threaded, 1 s entry/attr timeout)
# Every filesystem gets a fresh directory under /var/tmp (root ext4); smithfs works in
# smiths/smith-root/private/. --disk image puts each filesystem's directory (native's too) on
# its own freshly made ext4 image instead (a 4 GiB sparse file in /var/tmp on a loop device,
# mkfs.ext4 defaults, inode tables written at mkfs): no filesystem inherits the block-group
# history of the disk or of another column (docs/PERFORMANCE.md, "Method"). All mounts are
# live at once; each repetition runs each workload on every filesystem in turn (odd repetitions in reverse order). Caches are dropped before
# each workload (and between its cold phases) and the tools it times are warmed again.
# Must run as root (drop_caches, FUSE passthrough). Every mount made here is unmounted on exit,
# failure or Ctrl-C.
set -euo pipefail

me="bench.sh"
usage() {
    sed -n '4,51p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}
die() {
    echo "$me: error: $*" >&2
    exit 2
}
log() { echo "$me: $*" >&2; }

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
helpers="$repo_root/scripts/bench"
bench_dir="$repo_root/target/bench"
all_workloads=(create stat read untar rm rmcold seqwrite seqread git gitst par rm30k cp pip hook rss latency)
all_fs=(native op smith nopt bindfs pll opb phd phu opu smithu smithub remote remoteb)

quick=0
reps=""
out=""
build=1
hook_identity=""
hook_samples=""
hook_transport=""
disk=dir
only=()
fs_list=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1; shift ;;
        --reps) reps="${2:?--reps needs a number}"; shift 2 ;;
        --out) out="${2:?--out needs a file}"; shift 2 ;;
        --fs) fs_list="${2:?--fs needs a list}"; shift 2 ;;
        --no-build) build=0; shift ;;
        --disk) disk="${2:?--disk needs dir or image}"; shift 2 ;;
        --hook-identity) hook_identity="${2:?--hook-identity needs auto, cgroup or ancestry}"; shift 2 ;;
        --hook-transport) hook_transport="${2:?--hook-transport needs auto, io-uring or dev-fuse}"; shift 2 ;;
        --hook-samples) hook_samples="${2:?--hook-samples needs a number}"; shift 2 ;;
        --only)
            shift
            while [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; do only+=("$1"); shift; done
            [ ${#only[@]} -gt 0 ] || die "--only needs workload names"
            ;;
        -h | --help) usage ;;
        *) echo "$me: unknown argument $1" >&2; usage ;;
    esac
done
[ "$(id -u)" = 0 ] || die "must run as root (drop_caches, FUSE passthrough)"
case "$disk" in
    dir) ;;
    image) command -v mkfs.ext4 >/dev/null || die "--disk image needs mkfs.ext4 (e2fsprogs)" ;;
    *) die "--disk needs dir or image" ;;
esac
for w in "${only[@]}"; do
    [[ " ${all_workloads[*]} " == *" $w "* ]] || die "unknown workload $w (known: ${all_workloads[*]})"
done
[ ${#only[@]} -gt 0 ] || only=("${all_workloads[@]}")
fses=(native)
if [ -n "$fs_list" ]; then
    IFS=, read -r -a want <<<"$fs_list"
    for f in "${want[@]}"; do
        [[ " ${all_fs[*]} " == *" $f "* ]] || die "unknown filesystem $f (known: ${all_fs[*]})"
        [ "$f" = native ] || fses+=("$f")
    done
else
    fses=(native op smith nopt bindfs pll phd phu smithu)
fi
selected() { [[ " ${only[*]} " == *" $1 "* ]]; }

# Sizes: full run, then --quick.
if [ $quick = 1 ]; then
    reps="${reps:-1}" n_small=2000 seq_mib=256 git_files=1000 par_n=500 rm_files=6000 cp_n=100 hook_n=10
    lat_n=5000
    tree_files=2000 tree_dirs=350
else
    reps="${reps:-3}" n_small=10000 seq_mib=1024 git_files=3000 par_n=2500 rm_files=30000 cp_n=500 hook_n=40
    lat_n=20000
    tree_files=8500 tree_dirs=1500
fi
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps needs a positive number"
hook_n="${hook_samples:-$hook_n}"
[[ "$hook_n" =~ ^[1-9][0-9]*$ ]] || die "--hook-samples needs a positive number"
case "$hook_identity" in
    "" | auto | cgroup | ancestry) ;;
    *) die "--hook-identity needs auto, cgroup or ancestry" ;;
esac
case "$hook_transport" in
    "" | auto | io-uring | dev-fuse) ;;
    *) die "--hook-transport needs auto, io-uring or dev-fuse" ;;
esac
out="${out:-$bench_dir/results.md}"
mkdir -p "$bench_dir" "$(dirname "$out")"
records="${out%.md}.tsv"
: >"$records"
rec() { (IFS=$'\t'; echo "$*") >>"$records"; }

# --- tools -----------------------------------------------------------------------------------
if [ $build = 1 ]; then
    log "building smithfs (cargo build --release)"
    (cd "$repo_root" && cargo build --release --quiet) || die "cargo build failed"
fi
SMITHFS="${SMITHFS:-${CARGO_TARGET_DIR:-$repo_root/target}/release/smithfs}"
[ -x "$SMITHFS" ] || die "no smithfs binary at $SMITHFS (build it or set SMITHFS)"
if [[ " ${fses[*]} " =~ \ (opb|smithub|remoteb)\  ]]; then
    [ -x "${SMITHFS_B:-}" ] || die "--fs opb/smithub/remoteb needs SMITHFS_B=<another smithfs binary>"
fi
have_run=0
"$SMITHFS" run --help >/dev/null 2>&1 && have_run=1

fsops="$bench_dir/fsops"
if [ ! -x "$fsops" ] || [ "$helpers/fsops.c" -nt "$fsops" ]; then
    gcc -O2 -Wall -o "$fsops" "$helpers/fsops.c" || die "cannot build fsops"
fi

need_pll=0
[[ " ${fses[*]} " == *" pll "* ]] && need_pll=1
pll="$bench_dir/passthrough_ll"
if [ $need_pll = 1 ] && [ ! -x "$pll" ]; then
    ex=/usr/share/doc/libfuse3-dev/examples
    src="$bench_dir/pll-src"
    mkdir -p "$src"
    for f in passthrough_ll.c passthrough_helpers.h; do
        if [ -f "$ex/$f" ]; then cp "$ex/$f" "$src/$f"
        elif [ -f "$ex/$f.gz" ]; then gzip -dc "$ex/$f.gz" >"$src/$f"
        else die "$ex/$f not found (apt-get install libfuse3-dev)"; fi
    done
    # shellcheck disable=SC2046
    gcc -O2 -Wall -o "$pll" "$src/passthrough_ll.c" $(pkg-config --cflags --libs fuse3) \
        || die "cannot build passthrough_ll"
fi
[[ " ${fses[*]} " == *" bindfs "* ]] && ! command -v bindfs >/dev/null && die "bindfs is not installed"
php="${PASSTHROUGH_HP:-$repo_root/../shared/anchors/passthrough_hp}"
[ -x "$php" ] || php=/work/shared/anchors/passthrough_hp
if [[ " ${fses[*]} " == *" ph"* ]]; then
    [ -x "$php" ] || die "no passthrough_hp at $php (set PASSTHROUGH_HP)"
fi
uring_param=/sys/module/fuse/parameters/enable_uring
if [[ " ${fses[*]} " =~ \ (phu|opu|smithu|smithub)\  ]] || { [ "$hook_transport" = io-uring ] && selected hook; }; then
    [ -w "$uring_param" ] || die "no $uring_param: this kernel has no FUSE over io_uring"
fi
# uring_on / uring_off: hold enable_uring on around one io_uring mount's INIT, under the lock
# the tests' UringSwitch takes (the switch is machine-wide: a test or another script must not
# flip it in between). flock -u releases the lock even though the daemon inherits the fd.
uring_was=""
uring_lock=""
uring_on() {
    exec {uring_lock}>/tmp/smithfs-tests-enable-uring.lock
    flock "$uring_lock"
    uring_was="$(cat "$uring_param")"
    echo 1 >"$uring_param"
}
uring_off() {
    case "$uring_was" in Y | y | 1) echo 1 >"$uring_param" ;; *) echo 0 >"$uring_param" ;; esac
    flock -u "$uring_lock"
    exec {uring_lock}>&-
}

tarball="$bench_dir/tree-$tree_files.tar"
if { selected untar || selected rm || selected rmcold; } && [ ! -f "$tarball" ]; then
    python3 "$helpers/mktree.py" "$tarball.tmp" "$tree_files" "$tree_dirs" && mv "$tarball.tmp" "$tarball"
fi

PY="$(python3 -c 'import sys; print(sys.executable)')"
pip_pkgs=(six attrs idna certifi urllib3 charset-normalizer requests packaging)
wheels="$bench_dir/wheels"
if selected pip && [ ! -f "$wheels/.complete" ]; then
    log "caching wheels for the pip workload in $wheels"
    if "$PY" -m pip download --disable-pip-version-check -q -d "$wheels" "${pip_pkgs[@]}"; then
        touch "$wheels/.complete"
    else
        log "pip download failed: the pip workload is skipped"
    fi
fi
pip_install=("$PY" -m pip install --disable-pip-version-check --no-cache-dir --no-index
    --root-user-action=ignore -q --find-links "$wheels")

# The smith columns' workloads run in the sandbox (docs/SPEC.md §12, on by default): their tools
# (fsops, the tarball, the wheels), this script's helpers and the python that
# runs pip are outside its view unless config.json names them readable. SMITHFS_BENCH_SANDBOX=off
# turns the sandbox off in every smithfs column instead (a before/after of the sandbox's cost).
sandbox_reads() {
    "$PY" - "$1" "$bench_dir" "$helpers" "$("$PY" -c 'import sys; print(sys.prefix)')" <<'EOF'
import json, os, sys
path, *readable = sys.argv[1:]
c = json.load(open(path))
c.setdefault("sandbox", {})["readable"] = readable
if os.environ.get("SMITHFS_BENCH_SANDBOX") == "off":
    c["sandbox"]["enabled"] = False
json.dump(c, open(path, "w"), indent=2)
EOF
}

# The remote column's config: every run is `smithfs attach` on this host (launcher.kind
# loopback), its agent the shell running the task file the operator wrote (this script: the
# command of one measurement, quoted), with no retry.
remote_config() {
    "$PY" - "$1" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["launcher"] = {"kind": "loopback"}
c.setdefault("agent", {})
c["agent"]["command"] = ["/bin/bash", "-c", 'exec /bin/bash "$SMITH_TASK_FILE"']
c["agent"]["retries"] = 0
json.dump(c, open(sys.argv[1], "w"), indent=2)
EOF
}

# remote_run FS CMD...: CMD as the next run of smith-root on the remote column FS (remote or
# remoteb): its output (stdout and stderr, from messages.log) on stdout once it ended; fails
# unless it exited 0.
remote_run() {
    local m="${base[$1]}/$1" conv i remote_n
    shift
    # The runs so far, each ended (a count in this shell would be lost: measure runs this in a
    # command substitution).
    remote_n=$(($(find "$m/smiths/smith-root/conversations" -maxdepth 1 -name 'run-*' | wc -l) + 1))
    conv="$m/smiths/smith-root/conversations/$(printf 'run-%04d' "$remote_n")"
    printf '%q ' "$@" >"$m/smiths/smith-root/inbox/task-$remote_n.md"
    for ((i = 0; i < 36000; i++)); do
        grep -qs '"end": *"' "$conv/meta.json" && break
        sleep 0.1
    done
    cat "$conv/messages.log"
    grep -qs '"exit_code": *0[,}]' "$conv/meta.json"
}

# --- mounts and cleanup ----------------------------------------------------------------------
start=$SECONDS
T="$(mktemp -d /var/tmp/smithfs-bench.XXXXXX)"
mounts=() # "kind:path", in mount order
pids=()   # daemons started here
cleanup() {
    local rc=$? i m kind path pid
    trap - EXIT INT TERM
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m="${mounts[$i]}" kind="${m%%:*}" path="${m#*:}"
        mountpoint -q "$path" 2>/dev/null || continue
        if [ "$kind" = smithfs ]; then
            "$SMITHFS" umount "$path" >/dev/null 2>&1 || umount -l "$path" || true
        else
            umount "$path" 2>/dev/null || umount -l "$path" || true
        fi
    done
    for pid in "${pids[@]}"; do
        for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.3; done
        kill -0 "$pid" 2>/dev/null && kill "$pid" 2>/dev/null
    done
    if grep -q " $T/" /proc/self/mounts; then
        log "warning: mounts under $T remain; not removing it"
    else
        rm -rf "$T"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The pid of the daemon whose command line (arguments joined by spaces, with a trailing space)
# contains the fixed string S.
daemon_pid() {
    local p
    for p in $(pgrep -f -- "${1% }" || true); do
        if [ "$p" != $$ ] && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$1"; then
            echo "$p"
            return 0
        fi
    done
    return 0
}

# Where each filesystem lives: $T, or (--disk image) its own fresh ext4 mounted at $T/$fs.disk.
declare -A work backing pid_of base
for fs in "${fses[@]}"; do
    base[$fs]="$T"
    [ "$disk" = image ] || continue
    truncate -s 4G "$T/$fs.img"
    mkfs.ext4 -q -F -E lazy_itable_init=0,lazy_journal_init=0 "$T/$fs.img" || die "mkfs.ext4 $T/$fs.img failed"
    mkdir "$T/$fs.disk"
    mount -o loop "$T/$fs.img" "$T/$fs.disk" || die "cannot mount $T/$fs.img (loop devices?)"
    mounts+=("disk:$T/$fs.disk")
    base[$fs]="$T/$fs.disk"
done
for fs in "${fses[@]}"; do
    B="${base[$fs]}"
    case $fs in
        native) mkdir -p "$B/native/w"; backing[$fs]="$B/native/w"; work[$fs]="$B/native/w" ;;
        op | smith | nopt | opb | opu | smithu | smithub | remote | remoteb)
            "$SMITHFS" init "$B/$fs" >/dev/null
            sandbox_reads "$B/$fs/config.json"
            [[ "$fs" == remote* ]] && remote_config "$B/$fs/config.json"
            mkdir -p "$B/$fs/smiths/smith-root/private/w"
            backing[$fs]="$B/$fs/smiths/smith-root/private/w"
            work[$fs]="$B/$fs/smiths/smith-root/private/w"
            ;;
        bindfs | pll | phd | phu)
            mkdir -p "$B/$fs-src/w" "$B/$fs"
            backing[$fs]="$B/$fs-src/w"
            work[$fs]="$B/$fs/w"
            ;;
    esac
done

# The 30 000-file trees are made in the backing store before mounting: made through a mount,
# the kernel would hold every inode and the daemons (one O_PATH descriptor each) would run out
# of descriptors at RLIMIT_NOFILE (20 000 here).
if selected rm30k; then
    log "making the ${rm_files}-file trees (${#fses[@]} filesystems x $reps)"
    for fs in "${fses[@]}"; do
        for ((r = 1; r <= reps; r++)); do
            "$fsops" tree "${backing[$fs]}/rm30k-$r" "$rm_files" 100 0 >/dev/null
        done
    done
fi

for fs in "${fses[@]}"; do
    B="${base[$fs]}"
    case $fs in
        native) continue ;;
        op | smith | nopt | opb | opu | smithu | smithub | remote | remoteb)
            mounts+=("smithfs:$B/$fs")
            opts=()
            [ "$fs" = nopt ] && opts=(--no-passthrough)
            bin="$SMITHFS"
            { [ "$fs" = opb ] || [ "$fs" = smithub ] || [ "$fs" = remoteb ]; } && bin="$SMITHFS_B"
            if [ "$fs" = opu ] || [ "$fs" = smithu ] || [ "$fs" = smithub ]; then
                uring_on
                "$bin" mount "$B/$fs" "${opts[@]}" --transport io-uring || { uring_off; die "smithfs mount $B/$fs failed"; }
                uring_off
            else
                # Builds without --transport serve /dev/fuse anyway.
                "$bin" mount --help 2>/dev/null | grep -q -- --transport && opts+=(--transport dev-fuse)
                "$bin" mount "$B/$fs" "${opts[@]}" || die "smithfs mount $B/$fs failed"
            fi
            pid_of[$fs]="$(daemon_pid " mount $B/$fs ")"
            ;;
        phd | phu)
            mounts+=("fuse:$B/$fs")
            o=allow_other
            if [ "$fs" = phu ]; then o=allow_other,io_uring; uring_on; fi
            "$php" --foreground -o "$o" "$B/$fs-src" "$B/$fs" >"$B/$fs.log" 2>&1 &
            for _ in $(seq 1 100); do mountpoint -q "$B/$fs" && [ -d "$B/$fs/w" ] && break; sleep 0.05; done
            [ "$fs" = phu ] && uring_off
            mountpoint -q "$B/$fs" || die "passthrough_hp on $B/$fs failed: $(cat "$B/$fs.log")"
            pid_of[$fs]="$!"
            ;;
        bindfs)
            mounts+=("fuse:$B/bindfs")
            bindfs "$B/bindfs-src" "$B/bindfs" || die "bindfs failed"
            pid_of[$fs]="$(daemon_pid "bindfs $B/bindfs-src $B/bindfs")"
            ;;
        pll)
            mounts+=("fuse:$B/pll")
            "$pll" -o "source=$B/pll-src" "$B/pll" || die "passthrough_ll failed"
            pid_of[$fs]="$(daemon_pid "passthrough_ll -o source=$B/pll-src")"
            ;;
    esac
    if [ -n "${pid_of[$fs]}" ]; then pids+=("${pid_of[$fs]}"); fi
done

# --- measuring -------------------------------------------------------------------------------
declare -A fs_label=([native]="native ext4" [op]="smithfs operator" [smith]="smithfs smith"
    [nopt]="smithfs no-passthrough" [bindfs]="bindfs" [pll]="passthrough_ll"
    [opb]="smithfs B operator" [phd]="passthrough_hp" [phu]="passthrough_hp io_uring"
    [opu]="smithfs operator io_uring" [smithu]="smithfs smith io_uring"
    [smithub]="smithfs B smith io_uring" [remote]="smithfs remote (loopback)"
    [remoteb]="smithfs B remote (loopback)")
[ $have_run = 1 ] || fs_label[smith]="smithfs smith*"

# Run CMD on FS: bound to smith-root on the smith column (when `smithfs run` exists); a run of
# smith-root through its own remote mount on the remote column.
as_fs() {
    local fs=$1
    shift
    if [ "$fs" = remote ] || [ "$fs" = remoteb ]; then
        remote_run "$fs" "$@"
    elif { [ "$fs" = smith ] || [ "$fs" = smithu ] || [ "$fs" = smithub ]; } && [ $have_run = 1 ]; then
        "$SMITHFS" run --mount "${base[$fs]}/$fs" --smith smith-root -- "$@"
    else
        "$@"
    fi
}

# Drop the page, dentry and inode caches, then read FILEs and run the tools a workload times,
# so that only the filesystem under test starts cold.
settle() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
    cat "$fsops" "$@" >/dev/null
}

# measure WORKLOAD FS REP CMD...: CMD prints its elapsed seconds as its last line.
measure() {
    local wl=$1 fs=$2 rep=$3 o secs
    shift 3
    if o="$(as_fs "$fs" "$@" 2>"$T/err")" && secs="$(tail -n1 <<<"$o")" && [[ "$secs" =~ ^[0-9]+\.[0-9]+$ ]]; then
        rec time "$wl" "$fs" "$rep" "$secs"
        printf '%s: rep %d/%d  %-8s %-7s %9.3f s\n' "$me" "$rep" "$reps" "$wl" "$fs" "$secs" >&2
    else
        local why
        why="$(tr '\n\t' '  ' <"$T/err" | cut -c1-300)"
        rec fail "$wl" "$fs" "$rep" "${why:-no time printed}"
        log "rep $rep/$reps  $wl on $fs FAILED: ${why:-no time printed}"
    fi
}

# measure_latency FS REP FILE: `fsops latency` on FS; its total time as the latency workload's
# time, its p50/p99/max as a lat record.
measure_latency() {
    local fs=$1 rep=$2 o secs l
    if o="$(as_fs "$fs" "$fsops" latency "$3" "$lat_n" 2>"$T/err")" && secs="$(tail -n1 <<<"$o")" \
        && [[ "$secs" =~ ^[0-9]+\.[0-9]+$ ]] && l="$(grep -m1 '^latency_us ' <<<"$o")"; then
        rec time latency "$fs" "$rep" "$secs"
        read -r _ p50 p99 max <<<"$l"
        rec lat "$fs" "$rep" "$p50" "$p99" "$max"
        printf '%s: rep %d/%d  latency %-7s p50 %s µs, p99 %s µs\n' "$me" "$rep" "$reps" "$fs" "$p50" "$p99" >&2
    else
        local why
        why="$(tr '\n\t' '  ' <"$T/err" | cut -c1-300)"
        rec fail latency "$fs" "$rep" "${why:-no latency printed}"
        log "rep $rep/$reps  latency on $fs FAILED: ${why:-no latency printed}"
    fi
}

# safe.directory: the operator's column runs git in smith-root's private/, which the sandbox's
# user owns (git's ownership check would refuse it); a command-scope setting, as git requires.
git_env=(env GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_AUTHOR_NAME=bench
    GIT_AUTHOR_EMAIL=bench@example.invalid GIT_COMMITTER_NAME=bench
    GIT_COMMITTER_EMAIL=bench@example.invalid
    GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0='*')

run_group() { # group fs rep
    local g=$1 fs=$2 r=$3 w="${work[$2]}"
    # First let the kernel forget the inodes of the previous group: every one it holds costs
    # the passthrough daemons a descriptor.
    settle
    case $g in
        small)
            if selected create; then
                measure create "$fs" "$r" "$fsops" create "$w/small-$r" "$n_small" 4096
            elif selected stat || selected read; then
                "$fsops" create "$w/small-$r" "$n_small" 4096 >/dev/null
            fi
            if selected stat; then
                settle
                measure stat "$fs" "$r" "$fsops" stat "$w/small-$r" "$n_small"
            fi
            if selected read; then
                settle
                measure read "$fs" "$r" "$fsops" read "$w/small-$r" "$n_small"
            fi
            ;;
        tree)
            cat "$tarball" "$(command -v tar)" "$(command -v rm)" >/dev/null "$(command -v tar)" "$(command -v rm)"
            if selected untar; then
                mkdir -p "$w/tree-$r"
                measure untar "$fs" "$r" "$fsops" time tar -xf "$tarball" -C "$w/tree-$r"
            elif selected rm; then
                mkdir -p "$w/tree-$r"
                tar -xf "$tarball" -C "$w/tree-$r"
            fi
            if selected rm; then
                # Warm, but the untar's dirty data written out first: writeback the untar left
                # behind is not rm's work (a faster untar would leave more of it to rm).
                sync
                measure rm "$fs" "$r" "$fsops" time rm -rf "$w/tree-$r"
            fi
            if selected rmcold; then
                # Cold: the tree written out and every cache dropped, so rm's LOOKUPs and
                # READDIRs reach the filesystem (the kernel knows none of the tree's inodes).
                # Made as whoever then removes it (the smith on the smith column): rm needs
                # the write right in each directory it empties.
                as_fs "$fs" mkdir -p "$w/treec-$r"
                as_fs "$fs" tar -xf "$tarball" -C "$w/treec-$r"
                settle "$(command -v rm)"
                measure rmcold "$fs" "$r" "$fsops" time rm -rf "$w/treec-$r"
            fi
            ;;
        seq)
            if selected seqwrite; then
                measure seqwrite "$fs" "$r" "$fsops" seqwrite "$w/big-$r" "$seq_mib"
            elif selected seqread; then
                "$fsops" seqwrite "$w/big-$r" "$seq_mib" >/dev/null
            fi
            if selected seqread; then
                settle
                measure seqread "$fs" "$r" "$fsops" seqread "$w/big-$r"
            fi
            rm -f "$w/big-$r"
            ;;
        git)
            git --version >/dev/null
            mkdir -p "$w/git-$r"
            "${git_env[@]}" git -C "$w/git-$r" init -q
            "$fsops" tree "$w/git-$r/src" "$git_files" 100 2048 >/dev/null
            # shellcheck disable=SC2016
            commit=(sh -c 'git -C "$1" add -A && git -C "$1" commit -q -m bench' sh "$w/git-$r")
            if selected git; then
                measure git "$fs" "$r" "$fsops" time "${git_env[@]}" "${commit[@]}"
            else
                "${git_env[@]}" "${commit[@]}"
            fi
            if selected gitst; then
                # Hot: one untimed status first, then the timed ones find every cache warm; ten
                # of them, as one status takes only ~10 ms.
                as_fs "$fs" "${git_env[@]}" git -C "$w/git-$r" status --porcelain >/dev/null
                # shellcheck disable=SC2016
                measure gitst "$fs" "$r" "$fsops" time "${git_env[@]}" sh -c \
                    'for i in 1 2 3 4 5 6 7 8 9 10; do git -C "$1" status --porcelain; done' sh "$w/git-$r"
            fi
            ;;
        lat)
            printf 'x' >"$w/lat-$r"
            measure_latency "$fs" "$r" "$w/lat-$r"
            ;;
        par)
            measure par "$fs" "$r" "$fsops" par "$w/par-$r" 4 "$par_n" 4096
            ;;
        rm30k)
            rm --version >/dev/null
            measure rm30k "$fs" "$r" "$fsops" time rm -rf "$w/rm30k-$r"
            ;;
        cp)
            mkdir -p "$w/cp-$r"
            "$fsops" seqwrite "$w/cp-$r/src" 1 >/dev/null
            settle "$(command -v cp)" "$w/cp-$r/src"
            # shellcheck disable=SC2016
            measure cp "$fs" "$r" "$fsops" time sh -c \
                'i=0; while [ $i -lt "$2" ]; do cp "$1/src" "$1/c$i"; i=$((i + 1)); done' \
                sh "$w/cp-$r" "$cp_n"
            ;;
        pip)
            [ -f "$wheels/.complete" ] || return 0
            # Warm the interpreter and pip with a native install, then time the real one.
            rm -rf "$T/pip-warm"
            "${pip_install[@]}" --target "$T/pip-warm" "${pip_pkgs[@]}" >/dev/null
            measure pip "$fs" "$r" "$fsops" time "${pip_install[@]}" --target "$w/pip-$r" "${pip_pkgs[@]}"
            ;;
    esac
}

declare -A wl_label=(
    [create]="create+write 4 KiB+close ×$n_small"
    [stat]="lstat ×$n_small, cold"
    [read]="open+read+close ×$n_small, cold"
    [untar]="untar $tree_files files / $tree_dirs dirs"
    [rm]="rm -rf of that tree"
    [rmcold]="rm -rf of that tree, caches dropped first"
    [seqwrite]="sequential write $seq_mib MiB + fsync"
    [seqread]="sequential read $seq_mib MiB, cold"
    [git]="git add -A + commit, $git_files files"
    [gitst]="10× git status, hot, $git_files files"
    [par]="4 processes creating in parallel (4 × $par_n)"
    [rm30k]="rm -rf of a $rm_files-file tree"
    [cp]="${cp_n}× cp of a 1 MiB file"
    [pip]="pip install (${#pip_pkgs[@]} wheels) --target"
    [latency]="${lat_n}× statx, attributes forced (a GETATTR each)"
)

rec info date "$(date -u '+%Y-%m-%d %H:%M UTC')"
rec info machine "$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(awk '/MemTotal/ {printf "%.1f GiB RAM", $2 / 1048576}' /proc/meminfo)"
rec info kernel "$(uname -r)"
rec info "smithfs" "$SMITHFS; source: last commit touching src/ $(git -C "$repo_root" log -1 --format=%h -- src)$(git -C "$repo_root" diff --quiet HEAD -- src 2>/dev/null || echo ' (modified)')"
rec info mode "$([ $quick = 1 ] && echo quick || echo full), $reps repetition(s), workloads: ${only[*]}"
rec info disk "$([ "$disk" = image ] && echo "each filesystem on its own fresh 4 GiB ext4 image (loop device)" || echo "directories under /var/tmp ($(findmnt -no FSTYPE --target /var/tmp))")"
selected hook && rec info "hook mount" "--identity ${hook_identity:-(default)} --transport ${hook_transport:-(default)}, $hook_n samples"
rec info "load average at start" "$(cut -d' ' -f1-3 /proc/loadavg)"
for fs in "${fses[@]}"; do rec fs "$fs" "${fs_label[$fs]}"; done
for wl in "${all_workloads[@]}"; do
    if [ -n "${wl_label[$wl]:-}" ] && selected "$wl"; then rec workload "$wl" "${wl_label[$wl]}"; fi
done
[ $have_run = 1 ] || rec note "* this build has no \`smithfs run\`: the smith column ran as the operator."

groups=()
selected create || selected stat || selected read && groups+=(small)
selected untar || selected rm || selected rmcold && groups+=(tree)
selected seqwrite || selected seqread && groups+=(seq)
selected git || selected gitst && groups+=(git)
for g in par rm30k cp pip; do selected "$g" && groups+=("$g"); done
selected latency && groups+=(lat)


for ((r = 1; r <= reps; r++)); do
    order=("${fses[@]}")
    if ((r % 2 == 0)); then
        order=()
        for ((i = ${#fses[@]} - 1; i >= 0; i--)); do order+=("${fses[$i]}"); done
    fi
    for g in "${groups[@]}"; do
        for fs in "${order[@]}"; do
            run_group "$g" "$fs" "$r"
        done
    done
done

if selected rss; then
    for fs in "${fses[@]}"; do
        p="${pid_of[$fs]:-}"
        if [ -z "$p" ] || [ ! -r "/proc/$p/status" ]; then continue; fi
        rec extra rss_kb "$fs" "$(awk '/^VmRSS/ {print $2}' "/proc/$p/status")"
        rec extra hwm_kb "$fs" "$(awk '/^VmHWM/ {print $2}' "/proc/$p/status")"
    done
fi

# Hook latency: a fresh mount whose agent is `fsops stamp`; each inbox task's close() → stamp.
# The mount's config is the default one but for the agent, so the sandbox is on (docs/SPEC.md
# §12) and its cost is in the figure: the run sees no host /var/tmp (its own is private), so the
# stamp is written where the run may write and the bench can read, the smith's private/ through
# the mount (the same kernel: no cache stands between the two).
if selected hook; then
    d="$T/hook"
    stamp="$d/smiths/smith-root/private/hook-stamp"
    "$SMITHFS" init "$d" >/dev/null
    "$PY" - "$d/config.json" "$fsops" "$stamp" <<'EOF'
import json, sys
path, fsops, stamp = sys.argv[1:]
with open(path) as f:
    c = json.load(f)
c.setdefault("agent", {}).update({"command": [fsops, "stamp", stamp], "retries": 0, "timeout_secs": 60})
with open(path, "w") as f:
    json.dump(c, f, indent=2)
EOF
    mounts+=("smithfs:$d")
    hook_opts=()
    [ -n "$hook_identity" ] && hook_opts=(--identity "$hook_identity")
    [ -n "$hook_transport" ] && hook_opts+=(--transport "$hook_transport")
    [ "$hook_transport" = io-uring ] && uring_on
    hook_ok=1
    hook_err="$("$SMITHFS" mount "$d" "${hook_opts[@]}" 2>&1)" || hook_ok=0
    [ "$hook_transport" = io-uring ] && uring_off
    if [ $hook_ok = 0 ]; then
        rec hook result "not measured: mount with an agent configured failed: $(head -c 200 <<<"$hook_err")"
    else
        p="$(daemon_pid " mount $d ")"
        if [ -n "$p" ]; then pids+=("$p"); fi
        lat=()
        for ((i = 1; i <= hook_n; i++)); do
            t0="$("$fsops" inbox "$d/smiths/smith-root/inbox/task-$(printf %03d "$i").md")" || break
            # The stamp is rewritten by each run: this task's run wrote one later than t0.
            deadline=$((SECONDS + 10))
            v=0
            while [ "$v" -le "$t0" ] && [ $SECONDS -lt $deadline ]; do
                sleep 0.01
                v="$(cat "$stamp" 2>/dev/null)" || v=0
                [[ "$v" =~ ^[0-9]+$ ]] || v=0
            done
            [ "$v" -gt "$t0" ] || break
            lat+=("$((v - t0))")
            sleep 0.2 # let the run exit before the next task
        done
        if [ ${#lat[@]} -eq 0 ]; then
            rec hook result "not measured: no agent run stamped within 10 s of an inbox task"
        else
            printf '%s\n' "${lat[@]}" | sort -n | awk -v n="${#lat[@]}" '
                { v[NR] = $1 / 1e6 }
                END {
                    printf "hook\tsamples\t%d\n", n
                    printf "hook\tp50\t%.2f ms\n", v[int((n - 1) * 0.50) + 1]
                    printf "hook\tp99\t%.2f ms\n", v[int((n - 1) * 0.99) + 1]
                    printf "hook\tmax\t%.2f ms\n", v[n]
                }' >>"$records"
        fi
    fi
fi

rec info "load average at end" "$(cut -d' ' -f1-3 /proc/loadavg)"
rec info duration "$(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
python3 "$helpers/report.py" "$records" >"$out"
cat "$out"
log "report: $out (raw records: $records)"
