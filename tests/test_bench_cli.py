"""The benchmark runner: suite discovery, header, JSON output, table printing."""

import json

import pytest

from graphkern.bench import cli
from graphkern.bench.timing import Timing, scaled_estimate, time_cpu


def test_every_suite_has_the_interface():
    suites = cli.discover_suites()
    for name, mod in suites.items():
        assert isinstance(mod.HELP, str) and callable(mod.add_arguments) and callable(mod.run), name


def test_header_names_the_machine(capsys):
    info = cli.system_info()
    cli.print_header(info)
    out = capsys.readouterr().out
    assert "CPU" in out and "GPU" in out and info["threads"] >= 1


def test_unknown_suite_is_refused():
    with pytest.raises(SystemExit):
        cli.main(["no-such-suite"])


def test_json_output_for_one_suite(tmp_path, monkeypatch):
    class Fake:
        NAME = "fake"
        HELP = "a fake suite"

        @staticmethod
        def add_arguments(p):
            p.add_argument("--size", type=int, default=3)

        @staticmethod
        def run(args, ctx):
            return [{"size": args.size, "quick": ctx.quick, "seconds": 0.5}]

    monkeypatch.setattr(cli, "discover_suites", lambda: {"fake": Fake})
    path = tmp_path / "r.json"
    assert cli.main(["fake", "--size", "7", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["suites"]["fake"]["rows"] == [{"size": 7, "quick": False, "seconds": 0.5}]
    assert "cpu" in data["system"]
    # with no suite named, every suite runs in quick mode
    assert cli.main(["--json", str(path)]) == 0
    assert json.loads(path.read_text())["suites"]["fake"]["rows"][0]["quick"] is True


def test_a_failing_suite_is_reported_not_hidden(monkeypatch, capsys):
    class Broken:
        NAME, HELP = "broken", ""

        @staticmethod
        def add_arguments(p):
            pass

        @staticmethod
        def run(args, ctx):
            raise RuntimeError("boom")

    monkeypatch.setattr(cli, "discover_suites", lambda: {"broken": Broken})
    assert cli.main(["broken"]) == 1
    assert "boom" in capsys.readouterr().err


def test_timing_median_and_estimate():
    calls = []
    t = time_cpu(lambda: calls.append(1), repeat=5, warmup=2)
    assert len(calls) == 7 and len(t.times) == 5 and t.median >= 0
    est = scaled_estimate(Timing([1.0, 3.0, 2.0]), 10)
    assert est.median == 20.0 and est.estimated


def test_print_table(capsys):
    cli.print_table([{"a": 1.23456, "b": "x"}, {"a": None}], [("a", "A", "{:.2f}"), "b"], title="T")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "T" and "1.23" in out[3] and out[4].split()[0] == "-"
