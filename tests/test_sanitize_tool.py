"""tools/sanitize.py's reading of what a job killed by its time limit leaves behind (its verbose
pytest log and its sanitizer log), its job planning and its learned times, on made-up logs."""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))

import sanitize  # noqa: E402

IDS = ["tests/test_a.py::test_one", "tests/test_a.py::test_two[x-1]", "tests/test_a.py::test_three",
       "tests/test_a.py::test_four"]


def test_killed_job_outcomes_come_from_the_verbose_log():
    log = ("============ test session starts ============\ncollecting ... collected 4 items\n\n"
           "tests/test_a.py::test_one PASSED                                  [ 25%]\n"
           "tests/test_a.py::test_two[x-1] FAILED                             [ 50%]\n"
           "tests/test_a.py::test_three SKIPPED (no GPU)                      [ 75%]\n"
           "tests/test_a.py::test_four ")
    got, running = sanitize.pytest_outcomes(log, IDS, 80.0)
    assert got == {IDS[0]: ("passed", 20.0), IDS[1]: ("failed", 20.0), IDS[2]: ("skipped", 20.0)}
    assert running == IDS[3]


def test_an_error_at_teardown_makes_a_passed_test_failed_and_other_ids_are_ignored():
    log = ("tests/test_a.py::test_one PASSED   [ 50%]\ntests/test_a.py::test_one ERROR   [ 50%]\n"
           "tests/test_b.py::test_other PASSED   [100%]\n")
    got, running = sanitize.pytest_outcomes(log, IDS, 10.0)
    assert got == {IDS[0]: ("failed", 10.0)} and running is None
    assert sanitize.pytest_outcomes("", IDS, 10.0) == ({}, None)


def test_durations_of_the_times_output_style_are_used_where_printed():
    ids = IDS + ["tests/test_a.py::test_five[a b]"]
    log = ("tests/test_a.py::test_one PASSED                                                301.1ms\n"
           "tests/test_a.py::test_two[x-1] PASSED                                             4.021s\n"
           "tests/test_a.py::test_three FAILED                                              2m 5s\n"
           "tests/test_a.py::test_four SKIPPED (no GPU)                                    52.00us\n"
           "tests/test_a.py::test_five[a b] ")
    got, running = sanitize.pytest_outcomes(log, ids, 300.0)
    assert got == {IDS[0]: ("passed", 0.301), IDS[1]: ("passed", 4.021), IDS[2]: ("failed", 125.0),
                   IDS[3]: ("skipped", 0.0)}
    assert running == ids[4]


def test_a_killed_jobs_sanitizer_log_counts_every_report_line():
    banner = "========= COMPUTE-SANITIZER\n=========\n"
    assert sanitize.killed_reports(banner) == 0
    assert sanitize.killed_reports("") == 0
    race = banner + ("========= Error: Race reported between Write access at mgk_tiled+0x1a0\n"
                     "=========     and Read access at mgk_tiled+0x2b0 [16 hazards]\n=========\n")
    assert sanitize.killed_reports(race) == 2
    # a finished process's summary is read as before
    assert sanitize.reported(banner + "========= ERROR SUMMARY: 0 errors\n") == 0
    assert sanitize.reported(banner + "========= RACECHECK SUMMARY: 3 hazards displayed (1 errors, 2 warnings)") == 3
    assert sanitize.reported(banner) == ""


def test_a_test_longer_than_a_job_runs_alone():
    known = {("racecheck", IDS[1]): 500.0}
    jobs = sanitize.plan_jobs([("racecheck", t) for t in IDS], 100.0, known)
    assert jobs[0] == ("racecheck", [IDS[1]], 500.0)
    assert sorted(len(ids) for _, ids, _ in jobs) == [1, 1, 2]


def test_times_of_a_killed_job(tmp_path):
    jobs = [dict(tool="memcheck", ids=IDS, started=True, rc="timeout", seconds=100.0,
                 tests={IDS[0]: ["passed", 20.0], IDS[1]: ["passed", 20.0]}, running=IDS[2]),
            dict(tool="racecheck", ids=IDS[:2], started=True, rc="timeout", seconds=90.0, tests={}),
            dict(tool="initcheck", ids=IDS[:1], started=False)]
    path = tmp_path / "jobs.json"
    path.write_text(json.dumps(jobs))
    times = sanitize.measured_times(str(path))
    assert times == {("memcheck", IDS[0]): 20.0, ("memcheck", IDS[1]): 20.0, ("memcheck", IDS[2]): 60.0,
                     ("racecheck", IDS[0]): 45.0, ("racecheck", IDS[1]): 45.0}
    work = [(tool, t) for tool in ("memcheck", "racecheck") for t in IDS[:3]]
    assert sanitize.forget_times(times, work, "test_two=7,test_three") == {
        ("memcheck", IDS[0]): 20.0, ("memcheck", IDS[1]): 7.0, ("racecheck", IDS[0]): 45.0, ("racecheck", IDS[1]): 7.0}
