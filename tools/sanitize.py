"""Run the GPU tests under compute-sanitizer (memcheck, racecheck, initcheck) in many processes
spread over every visible GPU, and say per test what each tool found.

Each job is one tool over tests of one file, as many as fill about ``--job-seconds`` of
instrumented test time (a test estimated longer runs alone): a job's own start (interpreter,
imports, the sanitizer instrumenting every module it loads) is long when many processes share a
host, so jobs of a few tests spend most of a run starting (docs/reliability.md has the figures).
Test times come from earlier runs' ``sanitize_jobs.json`` (``--times``; ``--forget`` those of tests
whose sizes changed), else from per-file estimates.  Jobs start longest first; one starts only
while it is predicted to end within ``--budget`` seconds of the run's start (its estimate plus
``--start-seconds``), and none after ``--deadline``; the (tool, test) pairs left are written out for
a later run (``--ids-file``, whose lines are ``TOOL TEST_ID``, or a bare test id for every tool).
Per test: pass/fail and its time, from the job's JUnit XML, or where the job was cut by its time
limit or crashed, from its verbose pytest log (the tests it finished); per job: the tool's ERROR
SUMMARY, or for a job cut short every report line of its log.  Intended API errors (the
fault-injection tests) are not counted (``--report-api-errors no``).  Each process runs
``--omp-threads`` OpenMP threads (default 2) and no host backtraces (see the command below).

Usage: python tools/sanitize.py OUTDIR [--tools memcheck,racecheck,initcheck] [--files F ...]
         [--gpus 0,1] [--jobs-per-gpu 4] [--job-seconds 150] [--times JOBS.json] [--omp-threads 2]
         [--deadline 480] [--budget S] [--start-seconds 60] [--job-timeout 420] [--ids-file FILE]
         [--pytest-args "--combination-share 8"] [--forget PART[=SECONDS],...]
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

# estimated seconds of one test under a sanitizer, by file, for tests with no measured time (--times):
# the solvers' files take seconds per test, the rest about one
FILE_SECONDS = (("mgk_tiled", 15.0), ("mgk", 10.0), ("gpu_faults", 30.0), ("spgk", 2.5), ("expm", 2.0))
DEFAULT_SECONDS = 1.0

def collect(files, pytest_args, marker="gpu"):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, "-p",
                          "no:cacheprovider", *pytest_args, *files], capture_output=True, text=True)
    return [line.strip() for line in out.stdout.splitlines() if "::" in line]


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
        return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))
    except (OSError, subprocess.SubprocessError):
        return 1


def estimate(tool, test_id, known):
    """Seconds ``test_id`` takes under ``tool``: measured (``known``) or the file's estimate."""
    if (tool, test_id) in known:
        return known[tool, test_id]
    name = test_id.split("::")[0]
    return next((sec for key, sec in FILE_SECONDS if key in name), DEFAULT_SECONDS)


def measured_times(paths):
    """{(tool, test id): seconds} from earlier runs' sanitize_jobs.json files (comma-separated; empty
    without one): each test's own time; for a job cut by its time limit, the test it was running
    (``running``) gets the seconds the finished ones left, and where no test is known to have
    finished or run, every test the job's seconds shared -- lower bounds, far above a file's
    estimate for the slow ones.  A later file's figure replaces an earlier one's."""
    times = {}
    for path in (paths.split(",") if paths else []):
        with open(path) as f:
            for job in json.load(f):
                if not job.get("started"):
                    continue
                tests = job.get("tests") or {}
                times.update({(job["tool"], tid): float(sec) for tid, (_, sec) in tests.items()})
                if job.get("rc") != "timeout":
                    continue
                left = float(job["seconds"]) - sum(float(sec) for _, sec in tests.values())
                cut = [job["running"]] if job.get("running") else [] if tests else job["ids"]
                times.update({(job["tool"], tid): max(left / len(cut), times.get((job["tool"], tid), 0.0))
                              for tid in cut})
    return times


def forget_times(known, work, forget):
    """``known`` with the times of tests whose sizes changed since replaced: ``forget`` is
    "PART[=SECONDS],..."; a test whose id contains PART takes SECONDS under every tool, or the
    file's estimate where none is given."""
    known = dict(known)
    for item in filter(None, forget.split(",")):
        part, _, sec = item.partition("=")
        for tool, tid in work:
            if part in tid:
                known.pop((tool, tid), None)
                if sec:
                    known[tool, tid] = float(sec)
    return known


def plan_jobs(work, job_seconds, known, multi=frozenset()):
    """[(tool, ids, estimated seconds)] for ``work`` [(tool, test id)]: per tool and file (the
    tests of ``multi``, which need two GPUs, apart), consecutive tests up to ``job_seconds`` (a
    test estimated longer alone), longest job first (the long ones started last would leave the
    run waiting on them)."""
    by_file = defaultdict(lambda: defaultdict(list))
    for tool, t in work:
        by_file[tool][t.split("::")[0], t in multi].append(t)
    jobs = []
    for tool, files in by_file.items():
        for tests in files.values():
            group, total = [], 0.0
            for t in tests:
                sec = estimate(tool, t, known)
                if group and (total + sec > job_seconds or total > job_seconds):
                    jobs.append((tool, group, total))
                    group, total = [], 0.0
                group.append(t)
                total += sec
            if group:
                jobs.append((tool, group, total))
    return sorted(jobs, key=lambda job: -job[2])

def reported(log):
    """What a sanitizer log reports: memcheck and initcheck end with ``ERROR SUMMARY: N errors``,
    racecheck with ``RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)`` (hazards are
    counted: a warning is a race too); "" where the log has no summary (the process did not end)."""
    found = [int(n) for n in re.findall(r"ERROR SUMMARY: (\d+) error", log)]
    found += [int(n) for n in re.findall(r"RACECHECK SUMMARY: (\d+) hazard", log)]
    return sum(found) if found else ""


def junit(path):
    """{test id: (outcome, seconds)} from one job's JUnit XML (empty when the job never wrote it)."""
    results = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return results
    for case in root.iter("testcase"):
        file = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
        tid = f"{file}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        results[tid] = (outcome, float(case.get("time", 0.0)))
    return results


OUTCOME = re.compile(r"^(\S+::.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
# pytest's console_output_style=times: each test's duration ends its line ("812.3ms", "4.021s", "2m 5s")
DURATION = re.compile(r" (?:(\d+)h )?(?:(\d+)m )?(?:([\d.]+)(us|ms|s))?\s*$")
UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, None: 0.0}
SEVERITY = {"passed": 0, "skipped": 1, "failed": 2}


def pytest_outcomes(text, ids, seconds):
    """{test id: (outcome, seconds)} of the tests of ``ids`` that a verbose (``-v``) pytest log
    says finished, and the test it started last but never finished (None if none): (outcomes,
    running).  A test's seconds are those its line ends with (``-o console_output_style=times``),
    else an equal share of the job's ``seconds``.  An error at set-up or tear-down is a failure."""
    got, took, running = {}, {}, None
    for line in text.splitlines():
        m = OUTCOME.match(line)
        if m and m.group(1) in ids:
            word = m.group(2).lower()
            outcome = {"xfail": "passed", "xpass": "failed", "error": "failed"}.get(word, word)
            if SEVERITY[outcome] >= SEVERITY[got.get(m.group(1), "passed")]:
                got[m.group(1)] = outcome
            d = DURATION.search(line)
            if d and d.group(0).strip():
                h, mins, sec, unit = d.groups()
                took[m.group(1)] = (took.get(m.group(1), 0.0) + 3600 * int(h or 0) + 60 * int(mins or 0)
                                    + float(sec or 0) * UNIT[unit])
            running = None
        else:
            running = next((t for t in ids if line == t or line.startswith(t + " ")), running)
    share = seconds / max(1, len(got) + (running is not None))
    return {tid: (outcome, round(took.get(tid, share), 3)) for tid, outcome in got.items()}, running


def killed_reports(log):
    """Report lines of the sanitizer log of a process that did not end (no summary there): every
    ``=========`` line but the banner and blank ones counts, so a hazard found before the kill is
    never lost."""
    return sum(1 for line in log.splitlines() if line.startswith("=========")
               and line.strip("= ") and not line.startswith("========= COMPUTE-SANITIZER"))


def run_group(cmd, log_path, env, limit):
    """Run ``cmd`` in its own process group, output to ``log_path``: its exit status, or "timeout"
    when it ran past ``limit`` seconds; then the whole group ends (the sanitizer and the pytest it
    runs, which would otherwise keep a GPU busy), first asked to (the sanitizer writes out what it
    found), then forced."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            return proc.wait(timeout=max(limit, 1.0))
        except subprocess.TimeoutExpired:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
            proc.wait()
            return "timeout"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tools", default="memcheck,racecheck,initcheck")
    ap.add_argument("--files", nargs="*", default=None)
    ap.add_argument("--ids-file")
    ap.add_argument("--jobs-per-gpu", type=int, default=4)
    ap.add_argument("--gpus", default=None, help="ordinals to use, comma-separated (default: every GPU)")
    ap.add_argument("--job-seconds", type=float, default=150.0, help="estimated test seconds per job")
    ap.add_argument("--times", help="earlier runs' sanitize_jobs.json files (comma-separated): measured seconds "
                                    "per test and tool")
    ap.add_argument("--omp-threads", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=480.0, help="seconds after which no job starts")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds the run may take: a job starts only if predicted to end within them")
    ap.add_argument("--start-seconds", type=float, default=60.0,
                    help="a job's predicted start-up (interpreter, imports, instrumentation)")
    ap.add_argument("--job-timeout", type=float, default=420.0)
    ap.add_argument("--pytest-args", default="--combination-share 8")  # a random 1 in 8 of each grid a run
    ap.add_argument("--forget", default="", help="PART[=SECONDS],...: tests whose id contains PART, whose measured "
                                                 "times (--times) no longer hold, take SECONDS (else the file's estimate)")
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    logs = os.path.join(a.out, "sanitize")
    os.makedirs(logs, exist_ok=True)
    pytest_args = a.pytest_args.split()
    tools = a.tools.split(",")
    if a.ids_file:
        with open(a.ids_file) as f:
            lines = [line.strip() for line in f if line.strip()]
        work = []
        for line in lines:  # "TOOL ID" (one tool) or "ID" (every tool); an ID may hold spaces
            head, _, rest = line.partition(" ")
            if head in ("memcheck", "racecheck", "initcheck", "synccheck"):
                work += [(head, rest.strip())] if head in tools else []
            else:
                work += [(tool, line) for tool in tools]
    else:
        files = a.files or sorted(os.path.join("tests", f) for f in os.listdir("tests")
                                  if f.startswith("test_") and f.endswith(".py"))
        work = [(tool, tid) for tool in tools for tid in collect(files, pytest_args)]
    ids = sorted({tid for _, tid in work})
    gpus = a.gpus.split(",") if a.gpus else [str(k) for k in range(gpu_count())]
    n_gpus = len(gpus)
    # tests that take two devices run in jobs that see two GPUs (their own slot's first)
    multi = set(collect(sorted({t.split("::")[0] for t in ids}), pytest_args, "multigpu")) if n_gpus > 1 else set()
    jobs = plan_jobs(work, a.job_seconds, forget_times(measured_times(a.times), work, a.forget), multi)
    slots = n_gpus * a.jobs_per_gpu
    print(f"{len(ids)} tests ({len(work)} with a tool), {len(jobs)} jobs, {n_gpus} GPUs x {a.jobs_per_gpu} processes",
          flush=True)

    t_start = time.monotonic()
    free_slots = list(range(slots))
    lock = threading.Lock()
    records = []

    def run(k):
        tool, ids_k, predicted = jobs[k]
        elapsed = time.monotonic() - t_start
        if elapsed > a.deadline or (a.budget is not None and elapsed + a.start_seconds + predicted > a.budget):
            return dict(tool=tool, ids=ids_k, started=False)
        with lock:
            slot = free_slots.pop()
        base = os.path.join(logs, f"{tool}-{k:04d}")
        # a few OpenMP threads each: many processes with one thread per core each would spin on
        # each other's cores and slow every job many times over
        # GRAPHKERN_TEST_SANITIZER: the tests leave out their assertions about timing (tests/conftest.py)
        visible = gpus[slot % n_gpus] + (f",{gpus[(slot + 1) % n_gpus]}" if ids_k[0] in multi else "")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=visible, OMP_NUM_THREADS=str(a.omp_threads),
                   GRAPHKERN_TEST_SANITIZER=tool)
        # no host backtraces: capturing them keeps the Python frames of every CUDA call alive, and
        # with them the buffers those frames hold (the fault tests then see memory never freed)
        cmd = ["compute-sanitizer", "--tool", tool, "--show-backtrace", "no", "--report-api-errors", "no",
               "--print-limit", "20",
               "--log-file", base + ".log", sys.executable, "-m", "pytest", "-v", "-rf", "-p", "no:cacheprovider",
               "-o", "console_output_style=times", "--junitxml", base + ".xml", *pytest_args, *ids_k]
        t0 = time.monotonic()
        try:  # a job never outlives the run's budget, so the summary is always written
            rc = run_group(cmd, base + "-pytest.log", env,
                           a.job_timeout if a.budget is None else min(a.job_timeout, a.budget - elapsed))
        finally:
            with lock:
                free_slots.append(slot)
        seconds = round(time.monotonic() - t0, 1)
        summary, tests, running = "", junit(base + ".xml"), None
        try:
            with open(base + ".log", errors="replace") as f:
                text = f.read()
            summary = reported(text)
            if summary == "" and rc == "timeout":
                summary = killed_reports(text)
        except OSError:
            pass
        if not tests and rc not in (0, 1, 5):  # no JUnit XML: the tests the verbose log says finished
            with open(base + "-pytest.log", errors="replace") as f:
                tests, running = pytest_outcomes(f.read(), ids_k, seconds)
        return dict(tool=tool, ids=ids_k, started=True, rc=rc, seconds=seconds, gpu=visible,
                    sanitizer_errors=summary, tests=tests, running=running, log=base)

    with ThreadPoolExecutor(slots) as pool:
        for rec in pool.map(run, range(len(jobs))):
            records.append(rec)

    # per tool and file: tests passed / failed / not finished, sanitizer errors, slowest test
    table = defaultdict(lambda: dict(passed=0, failed=0, skipped=0, unfinished=0, errors=0, slowest=(0.0, "")))
    left = []
    failed = []
    for rec in records:
        for tid in rec["ids"]:
            row = table[(rec["tool"], tid.split("::")[0])]
            got = rec.get("tests", {}).get(tid) if rec["started"] else None
            if got is None and rec["started"] and rec["rc"] not in (0, 1, 5, "timeout"):
                # the process died (a crash) in the test it was running, else before any test ended
                if tid == (rec.get("running") or (None if rec.get("tests") else tid)):
                    got = ("failed", rec["seconds"])
            if got is None:
                row["unfinished"] += 1
                left.append(f"{rec['tool']} {tid}")
                continue
            row[got[0]] += 1
            if got[0] == "failed":
                failed.append(f"{rec['tool']} {tid} (sanitize-logs.tgz: sanitize/"
                              f"{os.path.basename(rec['log'])}-pytest.log)")
            if got[1] > row["slowest"][0]:
                row["slowest"] = (got[1], tid.split("::")[1])
        if rec["started"] and isinstance(rec["sanitizer_errors"], int):
            table[(rec["tool"], rec["ids"][0].split("::")[0])]["errors"] += rec["sanitizer_errors"]

    lines = [f"compute-sanitizer over {len(ids)} GPU tests ({len(work)} with a tool), {n_gpus} GPUs x {a.jobs_per_gpu} processes, "
             f"pytest {' '.join(pytest_args)}; wall {time.monotonic() - t_start:.0f} s",
             f"{'tool':<10} {'file':<36} {'pass':>5} {'fail':>5} {'skip':>5} {'left':>5} {'errors':>6}  slowest test"]
    for (tool, f), r in sorted(table.items()):
        lines.append(f"{tool:<10} {os.path.basename(f):<36} {r['passed']:>5} {r['failed']:>5} {r['skipped']:>5} "
                     f"{r['unfinished']:>5} {r['errors']:>6}  {r['slowest'][0]:.1f} s {r['slowest'][1][:60]}")
    lines += ["failed: " + x for x in failed]
    text = "\n".join(lines)
    print(text)
    with open(os.path.join(a.out, "sanitize_summary.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "sanitize_left.txt"), "w") as f:
        f.write("\n".join(sorted(set(left))) + ("\n" if left else ""))
    with open(os.path.join(a.out, "sanitize_jobs.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "tests"} | {"tests": r.get("tests", {})} for r in records],
                  f, indent=1)
    with tarfile.open(os.path.join(a.out, "sanitize-logs.tgz"), "w:gz") as tar:
        tar.add(logs, arcname="sanitize")
    shutil.rmtree(logs)
    return 0 if not failed and all(r["errors"] == 0 for r in table.values()) and not left else 1


if __name__ == "__main__":
    sys.exit(main())
