# tests/bounds.sh - sourced by the test scripts (after cd to the repository):
# every wait of a test has its own bound, and running past it fails that
# test with a line naming what it waited for, instead of hanging the suite.
#
#   bounded SECS CMD...     runs CMD under timeout(1), which gives it its own
#                           process group and kills all of it (mpirun's ranks
#                           too) after SECS s (KILL 10 s after TERM); then
#                           prints "FAIL: still running after SECS s, killed: CMD"
#                           and returns 124.  Otherwise CMD's status.
#   wait_until SECS WHAT CMD...
#                           runs CMD every 0.1 s until it succeeds; after SECS
#                           s prints "FAIL: WHAT: not within SECS s" and
#                           returns 1.
#   need PROGRAM...         a missing program (command -v) fails at once:
#                           "FAIL: PROGRAM is not installed (./tandem.sh deps
#                           installs it)", status 1.
#
# The FAIL lines go to the stderr the script had when it sourced this file
# (fd 9), so that a caller's 2>file does not swallow them.
exec 9>&2

bounded() {
    _b_s=$1
    shift
    _b_rc=0
    timeout -k 10 "$_b_s" "$@" || _b_rc=$?
    if [ "$_b_rc" -eq 124 ] || [ "$_b_rc" -eq 137 ]; then
        echo "FAIL: still running after $_b_s s, killed: $*" >&9
    fi
    return "$_b_rc"
}

wait_until() {
    _w_s=$1
    _w_what=$2
    shift 2
    _w_n=0
    until "$@"; do
        if [ "$_w_n" -ge $((_w_s * 10)) ]; then
            echo "FAIL: $_w_what: not within $_w_s s" >&9
            return 1
        fi
        sleep 0.1
        _w_n=$((_w_n + 1))
    done
}

need() {
    for _n_p in "$@"; do
        command -v "$_n_p" >/dev/null 2>&1 || {
            echo "FAIL: $_n_p is not installed (./tandem.sh deps installs it)" >&9
            return 1
        }
    done
}
