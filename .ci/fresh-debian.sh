#!/bin/sh
# .ci/fresh-debian.sh - `./tandem.sh test` as a new user runs it, on a
# pristine minimal Debian 12: no compiler, no make, no procps, no curl,
# empty apt lists.
#
#   .ci/fresh-debian.sh [DIR]        (as root; DIR defaults to /tmp/tandem-fresh)
#
# 1. debootstrap --variant=minbase bookworm DIR MIRROR (MIRROR: the Debian
#    archive this machine's apt uses, read from /etc/apt/sources.list*;
#    FRESH_MIRROR overrides it);
# 2. bind-mounts /proc, /sys, /dev and /dev/shm into it, copies
#    /etc/resolv.conf (name lookups for apt) and, when debootstrap left
#    none, /etc/hosts;
# 3. clones this repository (its committed HEAD: what CI would test) into
#    DIR/root/tandem with git on the host (the chroot has no git yet);
# 4. runs `./tandem.sh test` there as root, with a plain environment
#    (HOME=/root, a default PATH, no inherited OPENBLAS_* or TANDEM_*).
# Its exit status is that of ./tandem.sh test; the log is DIR.log.
#
# FRESH_DEBS=FILE.tgz keeps debootstrap's downloaded packages (the base
# system only) in FILE (debootstrap --make-tarball / --unpack-tarball), so
# that a rerun does not fetch them again; the chroot is still installed
# from scratch; FRESH_APT_CACHE=DIR does the same for the packages
# tandem.sh installs (bind-mounted as the chroot's apt archive cache).
# FRESH_KEEP=1 keeps DIR afterwards (unmounted).  Needs
# debootstrap (apt-get install debootstrap) and about 6 GB in DIR.
set -eu
cd "$(dirname "$0")/.."
REPO=$PWD
DIR=${1:-/tmp/tandem-fresh}
LOG=$DIR.log
[ "$(id -u)" -eq 0 ] || { echo "fresh-debian.sh: run as root (debootstrap, mount, chroot)"; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh-debian.sh: debootstrap missing (apt-get install debootstrap)"; exit 1; }

mirror=${FRESH_MIRROR:-}
if [ -z "$mirror" ]; then
    # deb822 (URIs: ...) or one-line (deb URI suite ...) sources; the archive, not security
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list 2>/dev/null |
        sed -n -e 's/^URIs: *\([^ ]*\).*/\1/p' -e 's/^deb  *\(\[[^]]*\] *\)\{0,1\}\([^ ]*\) .*/\2/p' |
        grep -v -e security -e nodesource -e google | head -n 1)
fi
[ -n "$mirror" ] || { echo "fresh-debian.sh: no Debian mirror in /etc/apt/sources.list*; set FRESH_MIRROR"; exit 1; }

unmount_all() {   # deepest first; lazily if busy
    for m in var/cache/apt/archives dev/shm dev sys proc; do
        if grep -q " $DIR/$m " /proc/mounts 2>/dev/null; then
            umount "$DIR/$m" 2>/dev/null || umount -l "$DIR/$m" 2>/dev/null || true
        fi
    done
}
mounted_under() { grep -q " $DIR/" /proc/mounts 2>/dev/null; }
cleanup() {
    unmount_all
    if mounted_under; then
        echo "fresh-debian.sh: something is still mounted under $DIR; not removing it"
    elif [ "${FRESH_KEEP:-0}" != 1 ]; then
        rm -rf "$DIR"
    fi
}

# a previous run's leftovers: unmount before removing anything
unmount_all
if mounted_under; then echo "fresh-debian.sh: $DIR has mounts left; unmount them first"; exit 1; fi
rm -rf "$DIR"
trap cleanup EXIT
trap 'exit 130' INT TERM
t0=$(date +%s)
echo "fresh-debian.sh: debootstrap --variant=minbase bookworm $DIR $mirror (log: $LOG)"
: >"$LOG"
if [ -n "${FRESH_DEBS:-}" ] && [ ! -s "$FRESH_DEBS" ]; then
    debootstrap --variant=minbase --make-tarball="$FRESH_DEBS" bookworm "$DIR.debs" "$mirror" >>"$LOG" 2>&1 ||
        { tail -n 20 "$LOG"; echo "fresh-debian.sh: debootstrap --make-tarball failed"; exit 1; }
    rm -rf "$DIR.debs"
fi
if [ -n "${FRESH_DEBS:-}" ]; then
    debootstrap --variant=minbase --unpack-tarball="$(realpath "$FRESH_DEBS")" bookworm "$DIR" "$mirror" >>"$LOG" 2>&1
else
    debootstrap --variant=minbase bookworm "$DIR" "$mirror" >>"$LOG" 2>&1
fi || { tail -n 20 "$LOG"; echo "fresh-debian.sh: debootstrap failed"; exit 1; }
echo "fresh-debian.sh: base system in $(($(date +%s) - t0)) s; apt lists: $(ls "$DIR/var/lib/apt/lists" | grep -c _Packages || true) package lists"

mount -t proc proc "$DIR/proc"
for m in sys dev dev/shm; do mount --bind "/$m" "$DIR/$m"; done
if [ -n "${FRESH_APT_CACHE:-}" ]; then   # the .debs only: apt still installs everything
    mkdir -p "$FRESH_APT_CACHE"
    mount --bind "$FRESH_APT_CACHE" "$DIR/var/cache/apt/archives"
fi
# what an installed machine has and debootstrap leaves out: name lookups
# for apt, and its own host name in /etc/hosts (OpenMPI looks it up)
cp -L /etc/resolv.conf "$DIR/etc/resolv.conf"
[ -s "$DIR/etc/hosts" ] || cp -L /etc/hosts "$DIR/etc/hosts"
# and this network's own certificate authorities, when the host has any (a
# proxy that inspects TLS: npm would refuse its certificate): the ones
# /usr/local/share/ca-certificates holds go in before ca-certificates is
# installed, which adds them to the system bundle; node reads that bundle
# through NODE_EXTRA_CA_CERTS, as it does on the host
extra_ca=""
if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
    mkdir -p "$DIR/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$DIR/usr/local/share/ca-certificates/"
    extra_ca="NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt"
    echo "fresh-debian.sh: this host's own certificate authorities copied in ($(ls /usr/local/share/ca-certificates/*.crt | wc -l))"
fi
git clone -q "$REPO" "$DIR/root/tandem"
echo "fresh-debian.sh: cloned $(git -C "$DIR/root/tandem" log -1 --format='%h %s'); running ./tandem.sh test as root"
rc=0
# shellcheck disable=SC2086
chroot "$DIR" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 $extra_ca \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/sh -c 'cd /root/tandem && ./tandem.sh test' >>"$LOG" 2>&1 || rc=$?
tail -n 25 "$LOG"
echo "fresh-debian.sh: ./tandem.sh test exited $rc after $(($(date +%s) - t0)) s on a fresh minbase bookworm (log: $LOG)"
exit "$rc"
