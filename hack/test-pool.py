#!/usr/bin/env python3
"""Runs integration tests in a pool of slots, longest first.

`cargo test` runs its test binaries one after another, each with a fixed
number of threads: a suite whose one long test runs on while its others are
done leaves a slot idle, and the next suite waits for it. This runner lists
the tests of every suite named with --split, makes each test a job of its
own (its suite's binary run with `--exact <test>`), adds each --whole suite
as one job (suites whose tests share a lock in one process), and hands the
jobs to --slots workers, the longest expected first. Expected times come
from the last run on this machine (--times, written at the end) and the
checked-in --seed; a test neither names is expected to take --default
seconds.

Each job's CPU time (its process and every child it waited for, the
operators it starts among them) is recorded beside its seconds. A job
whose CPU time was under --light of its wall time (it waits on timers:
cron minutes, cooldowns, deadlines) may also run in one of --light-slots
extra slots, beside the --slots jobs, so waiting fills idle cores instead
of a slot; every other job runs in the --slots only. A job never measured
counts as busy. A job whose CPU time was --heavy of its wall time or more
(a cluster of servers under writers, resharding, TLS handshakes) is heavy:
at most --heavy-slots of those run at once, so two cores are not shared
by three such jobs and every one of them slowed past its deadlines.

A --quiet job (suite:test; a test whose outcome depends on how fast the
operator reacts to a load it makes itself, such as memory filled faster
than a grow can follow) runs before the others, one at a time, and while
it runs at most --quiet-with other jobs that are not light run beside it.

Every job's own harness output (`test ... ok`, `test result: ...`) is
printed when it ends, a failed job's output in full; the totals at the end
are the sums of those harness lines. The exit status is 1 when a job failed
or when no test ran at all.
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

RESULT = re.compile(
    r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured; (\d+) filtered out"
)


def executables(suites, root):
    """Builds the suites' test binaries and maps each suite to its binary."""
    cmd = ["cargo", "test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]
    for s in suites:
        cmd += ["--test", s]
    out = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, check=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        target = msg.get("target", {})
        if "test" in target.get("kind", []) and target.get("name") in suites:
            found[target["name"]] = msg["executable"]
    missing = [s for s in suites if s not in found]
    if missing:
        sys.exit(f"test-pool: cargo built no test binary for: {' '.join(missing)}")
    return found


def listed(exe, root):
    out = subprocess.run(
        [exe, "--list", "--format", "terse"], cwd=root, stdout=subprocess.PIPE, check=True, text=True
    ).stdout
    return [line[: -len(": test")] for line in out.splitlines() if line.endswith(": test")]


def read_times(*paths):
    """Maps each job to (seconds, CPU seconds or None), the first path first."""
    times = {}
    for path in paths:
        if not path or not os.path.exists(path):
            continue
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if line.startswith("#") or len(parts) not in (2, 3):
                    continue
                try:
                    secs = float(parts[1])
                    cpu = float(parts[2]) if len(parts) == 3 else None
                except ValueError:
                    continue
                times.setdefault(parts[0], (secs, cpu))
    return times


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=3)
    ap.add_argument("--split", default="", help="suites run a test per job")
    ap.add_argument("--whole", default="", help="suites run as one job each")
    ap.add_argument("--skip", action="append", default=[], help="suite:test left out (run elsewhere)")
    ap.add_argument("--only", action="append", default=[], help="suite:test: run only these of the --split suites")
    ap.add_argument("--times", help="per-job seconds of the last run, read and rewritten")
    ap.add_argument("--seed", help="checked-in per-job seconds, read when --times lacks a job")
    ap.add_argument("--default", type=float, default=60.0)
    ap.add_argument("--light-slots", type=int, default=1, help="extra slots for jobs that mostly wait")
    ap.add_argument("--light", type=float, default=0.05, help="CPU share under which a job mostly waits")
    ap.add_argument("--heavy", type=float, default=0.2, help="CPU share from which a job is heavy")
    ap.add_argument("--heavy-slots", type=int, default=2, help="heavy jobs at most at once")
    ap.add_argument("--quiet", action="append", default=[],
                    help="suite:test run first, one at a time, beside at most --quiet-with busy jobs")
    ap.add_argument("--quiet-with", type=int, default=2, help="busy jobs at most beside a --quiet one")
    ap.add_argument("--logs", help="directory for each job's output")
    args = ap.parse_args()

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    split = args.split.split()
    whole = args.whole.split()
    skip = set(args.skip)
    only = set(args.only)
    exes = executables(split + whole, root)
    jobs = []
    for suite in split:
        for test in listed(exes[suite], root):
            if f"{suite}:{test}" not in skip and (not only or f"{suite}:{test}" in only):
                jobs.append((f"{suite}::{test}", [exes[suite], "--exact", test, "--test-threads=1"]))
    for suite in whole:
        jobs.append((suite, [exes[suite]]))
    expected = read_times(args.times, args.seed)
    quiet_names = {q.replace(":", "::", 1) for q in args.quiet}
    unknown = quiet_names - {name for name, _ in jobs}
    if unknown:
        print(f"test-pool: --quiet names no job: {', '.join(sorted(unknown))}", flush=True)
        return 1
    # Quiet jobs first (while the pool fills), then the longest first.
    jobs.sort(key=lambda j: (j[0] in quiet_names, expected.get(j[0], (args.default, None))[0]), reverse=True)

    def share(name):
        """The job's CPU time over its wall time when measured, else None."""
        secs, cpu = expected.get(name, (args.default, None))
        return cpu / secs if cpu is not None and secs > 0 else None

    def light(name):
        s = share(name)
        return s is not None and s < args.light

    def heavy(name):
        s = share(name)
        return s is not None and s >= args.heavy

    logs = args.logs or tempfile.mkdtemp(prefix="test-pool-")
    os.makedirs(logs, exist_ok=True)
    for old in os.listdir(logs):
        if old.endswith(".log"):
            os.remove(os.path.join(logs, old))
    env = dict(os.environ, CARGO_MANIFEST_DIR=root, RUST_BACKTRACE=os.environ.get("RUST_BACKTRACE", "1"))
    lock = threading.Lock()
    totals = [0, 0, 0]  # passed, failed, ignored
    failed_jobs = []
    took = {}
    start = time.monotonic()
    cpu_took = {}
    waiting = sum(1 for name, _ in jobs if light(name))
    heavies = sum(1 for name, _ in jobs if heavy(name))
    print(f"test-pool: {len(jobs)} jobs ({len(split)} suites a test per job, {len(whole)} whole) "
          f"in {args.slots} slots and {args.light_slots} for the {waiting} that mostly wait "
          f"(CPU under {args.light:.0%} of their time), {args.heavy_slots} at most at once of the "
          f"{heavies} heavy (CPU from {args.heavy:.0%}), {len(quiet_names)} quiet (first, one at a time, "
          f"beside at most {args.quiet_with} busy); job output under {logs}", flush=True)

    def run(job):
        name, cmd = job
        log = os.path.join(logs, re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".log")
        began = time.monotonic()
        with open(log, "w") as out:
            proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
        secs = time.monotonic() - began
        cpu = usage.ru_utime + usage.ru_stime
        with open(log, errors="replace") as f:
            text = f.read()
        counts = [0, 0, 0]
        seen = False
        for line in text.splitlines():
            m = RESULT.match(line)
            if m:
                seen = True
                counts[0] += int(m.group(1))
                counts[1] += int(m.group(2))
                counts[2] += int(m.group(3))
        # A job that ran no test (a name the binary no longer has) failed.
        ok = rc == 0 and seen and counts[1] == 0 and counts[0] + counts[2] > 0
        with lock:
            took[name] = secs
            cpu_took[name] = cpu
            for i in range(3):
                totals[i] += counts[i]
            at = time.monotonic() - start
            print(f"--- [{at:6.0f} s] {name}: {'ok' if ok else 'FAILED'} in {secs:.1f} s "
                  f"({cpu:.1f} s CPU)", flush=True)
            if ok:
                for line in text.splitlines():
                    if line.startswith("test ") and not line.startswith("test result"):
                        print(line)
                    elif RESULT.match(line):
                        print(line)
            else:
                if counts[1] == 0:
                    totals[1] += 1
                failed_jobs.append(name)
                print(text)
                print(f"--- end of {name} (exit {rc})")
            sys.stdout.flush()

    # Workers take the longest job left they may run: a slot any job, a
    # light slot only a job that mostly waits; a heavy job only while fewer
    # than --heavy-slots heavy jobs run; a quiet job only when no other quiet
    # one runs and at most --quiet-with busy (not light) jobs do, and while
    # one runs no busy job starts beyond those. A worker that may run none
    # of the jobs left waits for a job to end.
    queue = list(jobs)
    ended = threading.Condition(lock)
    heavy_running = [0]
    busy_running = [0]
    quiet_running = [0]

    def may_start(name):
        if heavy(name) and heavy_running[0] >= args.heavy_slots:
            return False
        if name in quiet_names:
            return quiet_running[0] == 0 and busy_running[0] <= args.quiet_with
        if quiet_running[0] and not light(name):
            return busy_running[0] <= args.quiet_with
        return True

    def worker(light_only):
        while True:
            with ended:
                while True:
                    may = [j for j in queue if not light_only or light(j[0])]
                    if not may:
                        return
                    job = next((j for j in may if may_start(j[0])), None)
                    if job is not None:
                        break
                    ended.wait()
                queue.remove(job)
                is_heavy = heavy(job[0])
                is_quiet = job[0] in quiet_names
                is_busy = is_quiet or not light(job[0])
                heavy_running[0] += is_heavy
                busy_running[0] += is_busy
                quiet_running[0] += is_quiet
            try:
                run(job)
            finally:
                with ended:
                    heavy_running[0] -= is_heavy
                    busy_running[0] -= is_busy
                    quiet_running[0] -= is_quiet
                    ended.notify_all()

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.slots + args.light_slots) as pool:
        workers = [pool.submit(worker, False) for _ in range(args.slots)]
        workers += [pool.submit(worker, True) for _ in range(args.light_slots)]
        for w in workers:
            w.result()

    wall = time.monotonic() - start
    busy = sum(took.values())
    print()
    print(f"test-pool: {len(jobs)} jobs in {wall:.0f} s wall ({busy:.0f} s of jobs, "
          f"{busy / max(wall, 1):.2f} slots busy on average)")
    print("longest jobs:")
    for name, secs in sorted(took.items(), key=lambda kv: kv[1], reverse=True)[:12]:
        print(f"  {secs:7.1f} s  {name} ({cpu_took[name]:.1f} s CPU)")
    if args.times:
        merged = read_times(args.times)
        for name, secs in took.items():
            merged[name] = (secs, cpu_took[name])
        with open(args.times, "w") as f:
            f.write("# seconds each job took in the last run and its CPU seconds (hack/test-pool.py)\n")
            for name in sorted(merged):
                secs, cpu = merged[name]
                f.write(f"{name}\t{secs:.1f}" + (f"\t{cpu:.1f}" if cpu is not None else "") + "\n")
    print(f"test result (all pooled jobs): {totals[0]} passed; {totals[1]} failed; {totals[2]} ignored")
    if failed_jobs:
        print("failed jobs:")
        for name in failed_jobs:
            print(f"    {name}")
        return 1
    if totals[0] == 0:
        print("test-pool: no test ran: a suite list is empty or every binary is broken")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
