#!/usr/bin/env bash
# Build the container image the testbed's container tests run: a Debian bookworm root file
# system (debootstrap minbase) with python3 and python3-venv, as a Charliecloud directory
# image, plus a SquashFS copy of it where ch-run can run one (see "SquashFS" below).
#
#   sudo bash testbed/image.sh    # progress on stderr; last stdout line: the image's path
#   IMAGE="$(sudo bash testbed/image.sh | tail -n 1)"
#
# Path: ${TESTBED_STATE:-/var/tmp/hpclaunch-testbed}/images/debian-python (outside /tmp,
# which is private to each testbed node). Owned by root, world-readable and not writable by
# anyone else, so hpcuser can run it (ch-run IMAGE -- ...) but cannot change it.
# Mirror: TESTBED_DEBIAN_MIRROR (default http://deb.debian.org/debian).
#
# Re-running is cheap: an image whose completion marker (etc/hpclaunch-image, written
# last) is present is kept. An interrupted build leaves only a temp folder
# (images/.debian-python.tmp.*), removed by the next run, which builds afresh: the image is
# built next to its final path and renamed into place when complete.
#
# Also installs the container tools when missing, like testbed/up.sh does for Slurm:
# charliecloud-runtime (ch-run), debootstrap, squashfs-tools (mksquashfs), squashfuse.
#
# SquashFS: Debian 12's ch-run 0.31 can run a SquashFS image directly (ch-run IMG.sqfs --
# CMD; it mounts it with the SquashFUSE library it links, libsquashfuse_ll, at
# /var/tmp/$USER.ch/mnt or -m DIR), but it cannot be asked whether it can:
# `ch-run --feature=squash` answers "unknown feature: squash" and exit 1 (0.31 knows only
# --feature=extglob; the squash feature came in later releases). So this script asks
# --feature=squash first (newer ch-run) and otherwise checks that ch-run links
# libsquashfuse. Running a .sqfs also needs /dev/fuse to be usable by the user: where it is
# root-only (crw------- as on some VMs), only root can run the .sqfs, and the directory
# image is what the tests use; this script leaves /dev/fuse's permissions alone.
set -euo pipefail

# stdout carries only the image's path; progress and commands' output go to stderr.
exec 3>&1 1>&2

export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin"
umask 022

STATE="${TESTBED_STATE:-/var/tmp/hpclaunch-testbed}"
MIRROR="${TESTBED_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
NAME=debian-python
IMAGES="$STATE/images"
IMAGE="$IMAGES/$NAME"
SQFS="$IMAGES/$NAME.sqfs"
MARKER_REL=etc/hpclaunch-image   # inside the image; written last
# openssh-server: hpclaunch dev --vscode runs the image's own sshd (tests/test_e2e_dev.py).
INCLUDE=python3,python3-venv,openssh-server

log() { printf 'testbed/image.sh: %s\n' "$*"; }
trap 'log "failed at line $LINENO (exit $?)"' ERR

# Delete a (partial) image tree. A killed debootstrap can leave proc, sys or a bound /dev
# mounted inside its target: unmount those first (deepest first), and never let rm cross
# into another file system.
remove_tree() {
    local dir="$1" mnt
    [[ -e "$dir" ]] || return 0
    while read -r mnt; do
        umount -l "$mnt" || true
    done < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r)
    rm -rf --one-file-system "$dir"
}

if [[ "$(id -u)" != 0 ]]; then
    log "must run as root (debootstrap and apt-get need it)"
    exit 1
fi
case "$STATE" in
    /tmp | /tmp/*)
        log "TESTBED_STATE=$STATE is under /tmp, which is private to each node; use e.g. /var/tmp"
        exit 1 ;;
    /*) ;;
    *) log "TESTBED_STATE must be an absolute path, got '$STATE'"; exit 1 ;;
esac
T0=$SECONDS

# ---------------------------------------------------------------------------------
# 1. Install what is missing (same way as testbed/up.sh, section 1).
# ---------------------------------------------------------------------------------
missing=()
for pair in ch-run:charliecloud-runtime debootstrap:debootstrap \
    mksquashfs:squashfs-tools squashfuse:squashfuse; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if ((${#missing[@]})); then
    log "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

# ---------------------------------------------------------------------------------
# 2. The directory image.
# ---------------------------------------------------------------------------------
mkdir -p "$IMAGES"
chmod 0755 "$IMAGES"
# One build at a time (two CI steps, or a user and a test, may start this at once).
exec 9>"$IMAGES/.lock"
flock 9

# Leftovers of interrupted runs: temp folders, and (below) an image without its marker.
for stale in "$IMAGES/.$NAME.tmp."*; do
    [[ -e "$stale" ]] || continue
    log "removing an interrupted build: $stale"
    remove_tree "$stale"
done
# An image built with other packages (an older INCLUDE) is built again.
WANT="debootstrap --variant=minbase --include=$INCLUDE $SUITE $MIRROR (slim)"
if [[ -f "$IMAGE/$MARKER_REL" ]] && [[ "$(head -n 1 "$IMAGE/$MARKER_REL")" == "$WANT" ]]; then
    log "image present: $IMAGE"
else
    if [[ -e "$IMAGE" ]]; then
        log "removing an incomplete image, or one of other packages: $IMAGE"
        remove_tree "$IMAGE"
        rm -f "$SQFS"
    fi
    TMP="$(mktemp -d "$IMAGES/.$NAME.tmp.XXXXXX")"
    log "debootstrap $SUITE (minbase + $INCLUDE) from $MIRROR into $TMP"
    t=$SECONDS
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$TMP" "$MIRROR"
    log "debootstrap took $((SECONDS - t)) s"
    # ch-run binds the host's /etc/hosts, /etc/resolv.conf, /etc/passwd and /etc/group
    # onto these files: they must exist in the image.
    for f in etc/hosts etc/resolv.conf etc/passwd etc/group; do
        [[ -e "$TMP/$f" ]] || : >"$TMP/$f"
    done
    # Downloaded packages, apt's package lists, documentation, manuals and translations
    # are not needed in the image (as in Docker's slim images): 40 % of it, which every
    # test that copies, packs, unpacks or scans an image would read again.
    rm -f "$TMP"/var/cache/apt/archives/*.deb
    rm -rf "$TMP"/var/lib/apt/lists/* "$TMP"/usr/share/doc/* "$TMP"/usr/share/man/* \
        "$TMP"/usr/share/locale/* "$TMP"/usr/share/info/*
    # Root-owned, world-readable (any user can `cp -a` it into a copy they own), writable
    # by root only: no world-writable folder (tmp, var/tmp are 1777 in a Debian tree;
    # ch-run binds the host's /tmp anyway). etc/shadow becomes readable too: it holds no
    # password (debootstrap locks every account with '*').
    chown root:root "$TMP"
    chmod 0755 "$TMP"
    chmod -R go-w,a+rX "$TMP"
    printf '%s\nbuilt %s\n' "$WANT" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$TMP/$MARKER_REL"
    chmod 0644 "$TMP/$MARKER_REL"
    mv -T "$TMP" "$IMAGE"
    log "image built: $IMAGE ($(du -sh "$IMAGE" | cut -f1))"
fi

# ---------------------------------------------------------------------------------
# 3. The SquashFS copy, where ch-run can run one (see the header).
# ---------------------------------------------------------------------------------
squash_supported() {
    USER="${USER:-root}" ch-run --feature=squash >/dev/null 2>&1 && return 0
    # grep reads all of ldd's lines (not -q): under pipefail, grep -q leaving at the first
    # match could end ldd by SIGPIPE, and the check then failed at random.
    ldd "$(command -v ch-run)" 2>/dev/null | grep libsquashfuse >/dev/null
}
if ! squash_supported; then
    log "this ch-run cannot run SquashFS images; no $SQFS"
elif [[ -f "$SQFS" && "$SQFS" -nt "$IMAGE/$MARKER_REL" ]]; then
    log "SquashFS image present: $SQFS"
else
    log "mksquashfs $IMAGE -> $SQFS"
    rm -f "$IMAGES/.$NAME.sqfs.tmp"
    mksquashfs "$IMAGE" "$IMAGES/.$NAME.sqfs.tmp" -noappend -quiet -no-progress
    chmod 0644 "$IMAGES/.$NAME.sqfs.tmp"
    mv -f "$IMAGES/.$NAME.sqfs.tmp" "$SQFS"
    log "SquashFS image built: $SQFS ($(du -sh "$SQFS" | cut -f1))"
fi

log "done in $((SECONDS - T0)) s"
echo "$IMAGE" >&3
