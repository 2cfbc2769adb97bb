# tests/serve_lib.sh - one `tandem serve` under test, for the command-level
# tests that drive a server (sourced after tests/bounds.sh; the caller
# defines TANDEM, TMP and fail).
#   SERVE_ARGS      options every start_server of the script adds
#   SERVE_CKPT_FLAG how start_server passes CKPT (default --ckpt; --follow)
#   start_server CKPT [ARGS...]   starts it on a free port, waits (30 s at
#                   most) for its start-up line, checks /health; sets pid
#                   and port; prints the start-up line SERVE_SHOW (1)
#   stop_server     SIGTERM, waits (10 s at most), expects exit 0 and the
#                   "stopped" line
SERVE_ARGS=${SERVE_ARGS:-}
SERVE_SHOW=${SERVE_SHOW:-1}

start_server() {
    ck=$1
    shift
    # emptied here, not by the server's redirection: the loop below must
    # never read the previous server's start-up line (and its port)
    : >"$TMP/serve.log"
    # shellcheck disable=SC2086
    "$TANDEM" serve "${SERVE_CKPT_FLAG:---ckpt}" "$ck" --port 0 --kv-mb 16 --max-running 16 --max-body 65536 $SERVE_ARGS "$@" \
        2>>"$TMP/serve.log" &
    pid=$!
    port=""
    i=0
    while [ -z "$port" ]; do
        kill -0 "$pid" 2>/dev/null || fail "the server exited at start"
        [ $i -lt 300 ] || fail "no start-up line after 30 s"
        port=$(sed -n 's|^tandem: serving .* on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$TMP/serve.log" 2>/dev/null) || port=""   # the log may not exist yet
        i=$((i + 1))
        [ -n "$port" ] || sleep 0.1
    done
    sed -n "${SERVE_SHOW}p" "$TMP/serve.log"
    curl -sf --max-time 10 "http://127.0.0.1:$port/health" >/dev/null || fail "/health (curl, 10 s)"
}

stop_server() {
    kill -TERM "$pid"
    i=0
    while kill -0 "$pid" 2>/dev/null; do
        [ $i -lt 100 ] || fail "the server still runs 10 s after SIGTERM"
        i=$((i + 1))
        sleep 0.1
    done
    rc=0
    wait "$pid" || rc=$?
    pid=""
    [ "$rc" -eq 0 ] || fail "serve exit code $rc after SIGTERM"
    grep -q "tandem: serve: stopped" "$TMP/serve.log" || fail "no clean stop in the log"
}
