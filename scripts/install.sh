#!/usr/bin/env bash
# Install smithfs: build it (scripts/build.sh), then copy the binary, the mount(8) helper, shell
# completions and man pages under a prefix, and say where each went.
#
# Usage: scripts/install.sh [--prefix DIR] [--sbin DIR] [--no-build]
#   --prefix DIR  where to install (default: $PREFIX, else /usr/local as root, ~/.local otherwise)
#                   DIR/bin/smithfs                                   the binary
#                   DIR/share/bash-completion/completions/smithfs    bash completion
#                   DIR/share/zsh/site-functions/_smithfs            zsh completion
#                   DIR/share/fish/vendor_completions.d/smithfs.fish fish completion
#                   DIR/share/man/man1/smithfs.1, smithfs-*.1        man pages
#   --sbin DIR    where the mount(8) helper mount.fuse.smithfs goes, a symlink to the binary
#                 (default: /sbin as root — mount(8) looks for helpers only there —, else
#                 DIR/sbin under the prefix; `--sbin ''` skips it). An existing file there that
#                 is not a symlink to a smithfs binary is left alone (with a warning).
#   --no-build    install target/release/smithfs as it is ($SMITHFS_BIN: another binary)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if [ "$(id -u)" = 0 ]; then
    prefix=${PREFIX:-/usr/local}
    sbin=/sbin
else
    prefix=${PREFIX:-$HOME/.local}
    sbin=
fi
sbin_set=0
build=1
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
        --prefix=*) prefix=${1#--prefix=}; shift ;;
        --sbin) sbin=${2?--sbin needs a directory (or '')}; sbin_set=1; shift 2 ;;
        --sbin=*) sbin=${1#--sbin=}; sbin_set=1; shift ;;
        --no-build) build=0; shift ;;
        -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$sbin_set" = 1 ] || [ -n "$sbin" ] || sbin=$prefix/sbin
case $prefix in /*) ;; *) prefix=$(pwd)/$prefix ;; esac

say() { printf 'install: %s\n' "$*"; }
if [ "$build" = 1 ]; then
    "$REPO/scripts/build.sh"
fi
bin=${SMITHFS_BIN:-$REPO/target/release/smithfs}
[ -x "$bin" ] || { echo "install: $bin is missing (run without --no-build)" >&2; exit 1; }

dest=$prefix/bin/smithfs
install -d "$prefix/bin"
# Copy then rename: a running daemon keeps its (old) binary, the next one starts the new one.
install -m 0755 "$bin" "$dest.new.$$"
mv -f "$dest.new.$$" "$dest"
say "binary       $dest ($("$dest" --version))"

if [ -n "$sbin" ]; then
    helper=$sbin/mount.fuse.smithfs
    if [ -e "$helper" ] || [ -L "$helper" ]; then
        target=$(readlink "$helper" || :)
        case $target in
            */smithfs | smithfs) ln -sfn "$dest" "$helper"
                say "mount helper $helper -> $dest (replaced the link to $target)" ;;
            *) say "warning: $helper exists and is not a link to smithfs: left alone (fstab type fuse.smithfs uses it)" ;;
        esac
    else
        install -d "$sbin"
        ln -s "$dest" "$helper"
        say "mount helper $helper -> $dest (fstab type fuse.smithfs)"
    fi
    case $sbin in
        /sbin | /usr/sbin) ;;
        *) say "note: mount(8) looks for helpers in /sbin only: fstab lines need a root install" ;;
    esac
fi

comp=$prefix/share
install -d "$comp/bash-completion/completions" "$comp/zsh/site-functions" "$comp/fish/vendor_completions.d"
"$dest" completions bash >"$comp/bash-completion/completions/smithfs"
"$dest" completions zsh >"$comp/zsh/site-functions/_smithfs"
"$dest" completions fish >"$comp/fish/vendor_completions.d/smithfs.fish"
say "completions  $comp/bash-completion/completions/smithfs"
say "             $comp/zsh/site-functions/_smithfs"
say "             $comp/fish/vendor_completions.d/smithfs.fish"

man=$prefix/share/man/man1
"$dest" man --dir "$man"
say "man pages    $man/smithfs.1 and smithfs-COMMAND.1 ($(ls "$man"/smithfs*.1 | wc -l) pages: man smithfs-mount)"

case ":$PATH:" in
    *":$prefix/bin:"*) ;;
    *) say "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
say "next: smithfs doctor   (what this machine offers, as you)"
