#!/usr/bin/python3
"""tests/ref/rollout_follow.py - drives `tandem rollout --follow` through a
checkpoint swap at a chosen moment (tests/cli/rollout.sh).

  rollout_follow.py --out OUT.jsonl --err ERR.log --during 'sh command'
                    [--wait-stderr TEXT --then 'sh command'] [--expect-fail]
                    -- tandem rollout --follow DIR ...

Starts the rollout, waits for its first sample (generation is under way,
requests are in flight and others still queued), stops it (SIGSTOP), runs
--during (e.g. a trainer that writes the next checkpoint and moves
DIR/latest), and lets it continue (SIGCONT).  Stopping makes the race
deterministic: however fast the machine, the new checkpoint lands while the
rollout has work left.  With --wait-stderr, once TEXT appears on the
rollout's stderr, --then runs while it keeps going.  Writes stdout and
stderr to OUT and ERR.  Exit 0 when the rollout exits 0 (or, with
--expect-fail, exits non-zero with exactly one error line).  Every wait
(the first sample, --during, --wait-stderr, --then, the rollout's end) is
bounded by --timeout seconds and fails with a line naming it.
"""
import argparse
import os
import signal
import subprocess
import sys
import threading
import time


def call_bounded(cmd, timeout):
    """Runs the shell command cmd in its own process group; its exit status,
    or None when it ran past timeout seconds (then the group is killed)."""
    q = subprocess.Popen(cmd, shell=True, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        return q.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(q.pid, signal.SIGKILL)
        q.wait()
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--err", required=True)
    ap.add_argument("--during", required=True)
    ap.add_argument("--wait-stderr")
    ap.add_argument("--then")
    ap.add_argument("--expect-fail", action="store_true")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = [], []
    first, cond = threading.Event(), threading.Condition()

    def read_out():
        for line in p.stdout:
            out.append(line)
            first.set()
        first.set()

    def read_err():
        for line in p.stderr:
            with cond:
                err.append(line.decode(errors="replace"))
                cond.notify_all()

    threads = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
    for t in threads:
        t.start()

    def finish(ok, msg):
        if p.poll() is None:
            p.kill()
        for t in threads:
            t.join()
        with open(a.out, "wb") as f:
            f.writelines(out)
        with open(a.err, "w") as f:
            f.writelines(err)
        if not ok:
            print("rollout_follow: FAIL: " + msg)
            sys.stdout.write("".join(err[-20:]))
            sys.exit(1)
        print("ok   " + msg)
        sys.exit(0)

    t0 = time.time()
    if not first.wait(a.timeout) or not out:
        finish(False, "no sample within %g s" % a.timeout)
    p.send_signal(signal.SIGSTOP)
    n_before = len(out)
    rc = call_bounded(a.during, a.timeout)
    p.send_signal(signal.SIGCONT)
    if rc is None:
        finish(False, "--during still running after %g s (killed): %s" % (a.timeout, a.during))
    if rc != 0:
        finish(False, "--during failed (exit %d): %s" % (rc, a.during))
    if a.wait_stderr:
        with cond:
            if not cond.wait_for(lambda: any(a.wait_stderr in l for l in err) or p.poll() is not None,
                                 a.timeout):
                finish(False, "no %r on stderr" % a.wait_stderr)
        if not any(a.wait_stderr in l for l in err):
            finish(False, "the rollout ended before %r appeared on stderr" % a.wait_stderr)
        rc = call_bounded(a.then, a.timeout)
        if rc != 0:
            finish(False, "--then %s: %s" % ("still running after %g s (killed)" % a.timeout if rc is None
                                             else "failed (exit %d)" % rc, a.then))
    try:
        rc = p.wait(a.timeout)
    except subprocess.TimeoutExpired:
        finish(False, "the rollout did not finish within %g s" % a.timeout)
    for t in threads:
        t.join()
    errors = [l for l in err if "error" in l]
    if a.expect_fail:
        finish(rc != 0 and len(errors) == 1,
               "rollout exit %d with %d error lines (want non-zero and one): %s"
               % (rc, len(errors), errors[0].strip() if errors else ""))
    finish(rc == 0, "rollout --follow exit %d in %.1f s, %d samples (%d before the swap was published)"
           % (rc, time.time() - t0, len(out), n_before))


if __name__ == "__main__":
    main()
