#!/bin/sh
# tandem.sh - set up a fresh Debian 12 machine and hand over to make.
#   ./tandem.sh demo     install what is missing, then `make demo`
#   ./tandem.sh test     install what is missing, then `make test`
#   ./tandem.sh deps     only install what is missing (what `make deps` runs)
#   ./tandem.sh <target> any other make target (bench, asan-test, ...)
# Installs only when something is missing, so on a ready machine it costs
# nothing.  Needs root (or sudo) the first time.
set -eu
cd "$(dirname "$0")"

# Debian packages the build, the tests and the demo need (SPEC section 1).
TANDEM_PKGS="make gcc libc6-dev pkg-config git ca-certificates
 openmpi-bin libopenmpi-dev libopenblas-dev libhdf5-openmpi-dev hdf5-tools
 libcriterion-dev libcjson-dev libmicrohttpd-dev curl fortunes
 python3-minimal python3-numpy python3-h5py python3-torch"
# make fuzz: libFuzzer harnesses (tests/fuzz) build with clang and its runtime
TANDEM_PKGS="$TANDEM_PKGS clang libclang-rt-14-dev"

missing=""
for p in $TANDEM_PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
if [ -n "$missing" ]; then
    echo "tandem.sh: installing:$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
[ "${1:-}" = deps ] && exit 0
[ $# -gt 0 ] || set -- all
exec make "$@"
