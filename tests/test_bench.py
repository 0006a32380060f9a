"""Bench output has the schema its report reads (no timing assertions: speed belongs to the bench)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.bench import report, runner
from localspec.engine.config import EngineConfig
from localspec.engine.scheduler import Engine
from tests.common import TEST_THREADS


def test_suites_ship_with_the_package():
    suites = runner.load_suites()
    assert {"code", "chat", "editing", "long"} <= set(suites)
    assert all(len(s["prompts"]) >= 2 for s in suites.values())


@pytest.mark.models
def test_bench_json_table_and_chart_from_a_real_mini_run(tmp_path, target_path, draft_path):
    plan = runner.BenchPlan(
        suites=["editing"], modes=[runner.ModeSpec("off", "off"), runner.ModeSpec("lookup", "lookup"),
                                    runner.ModeSpec("draft-k3", "draft", 3)],
        prompts_per_suite=1, repeats=1, max_tokens=12, n_ctx=4096, threads=TEST_THREADS,
    )
    # The long-context suite's prompt (used for the prefix-reuse TTFT) is ~2k tokens.
    engine = Engine.load(str(target_path), str(draft_path), EngineConfig(n_ctx=4096, n_threads=TEST_THREADS, mode="off"))
    ticks: list[str] = []
    try:
        runs = runner.run_modes(engine, plan, ticks.append)
        ttft = runner.second_turn_ttft(engine, ticks.append)
    finally:
        engine.close()
    assert len(runs) == 3 and len(ticks) == 4
    summary = runner.summarize(runs)
    result = {
        "schema": runner.SCHEMA_VERSION, "machine": runner.machine(), "command": "localspec bench --test",
        "plan": {}, "runs": runs, "summary": summary, "ttft": ttft,
        "acceptance_by_position": runner.acceptance_by_position(runs),
        "goals": runner.goals(summary, ttft, {"off": 2000.0}, 2500.0),
    }
    report.check_schema(json.loads(json.dumps(result)))  # survives a JSON round trip
    assert summary["editing"]["off"]["ratio_to_off"] == pytest.approx(1.0)
    assert ttft["second_turn_reused_tokens"] > ttft["cold_prompt_tokens"] - 2
    md = report.markdown(result)
    assert "| editing |" in md and "P1" in md and "P7" in md
    png = report.chart(result, tmp_path / "bench.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_schema_check_names_what_is_missing():
    with pytest.raises(ValueError, match="summary"):
        report.check_schema({"schema": 1, "machine": {}, "command": "", "plan": {}, "runs": [], "goals": {},
                             "acceptance_by_position": {}})


def test_ratios_pair_each_run_with_off_on_the_same_prompt_and_repeat():
    # Prompt 0 decodes at 30 tok/s and prompt 1 at 20; `auto` is 10% faster on both. The ratio of
    # the two medians would mix prompts; the paired ratio sees the 10%.
    runs = []
    for rep in range(2):
        for pid, base in ((0, 30.0), (1, 20.0)):
            runs.append({"suite": "code", "prompt": pid, "rep": rep, "mode": "off", "tps": base})
            runs.append({"suite": "code", "prompt": pid, "rep": rep, "mode": "auto", "tps": base * 1.1})
    runs.append({"suite": "code", "prompt": 0, "rep": 0, "mode": "llama-server:ngram-simple", "tps": 27.0})
    summary = runner.summarize(runs)
    assert summary["code"]["auto"]["ratio_to_off"] == pytest.approx(1.1)
    assert summary["code"]["auto"]["paired_runs"] == 4
    assert summary["code"]["llama-server:ngram-simple"]["ratio_to_off"] == pytest.approx(0.9)
    goals = runner.goals(summary, None, None, None)
    assert goals["P1"]["value"] == pytest.approx(1.1) and goals["P1"]["met"]
    assert goals["P3"]["value"]["code"] == pytest.approx(1.1 / 0.9)


# ---------------------------------------------------------------- bench --readme: the docs page and README summary

REPO = Path(__file__).resolve().parents[1]
QUICK_JSON = REPO / "docs" / "bench" / "quick.json"  # a real (quick) bench run, committed
README_TEXT = """# project

Hand-written intro.

<!-- bench-summary:start -->
old summary
<!-- bench-summary:end -->

Hand-written outro.
"""


def _bench(*args: str) -> int:
    from localspec.cli import main

    return main(["bench", "--from-json", str(QUICK_JSON), *args])


def test_readme_option_writes_the_full_tables_to_docs_and_a_short_summary_to_the_readme(tmp_path, monkeypatch, capsys):
    (tmp_path / "README.md").write_text(README_TEXT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert _bench("--out", "out", "--readme") == 0  # no path: ./README.md
    result = json.loads(QUICK_JSON.read_text())
    page = (tmp_path / "docs" / "performance.md").read_text(encoding="utf-8")
    assert report.markdown(result).strip() in page and page.startswith("# Performance")
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "Hand-written intro." in readme and "Hand-written outro." in readme and "old summary" not in readme
    summary = readme.split(report.SUMMARY.start)[1].split(report.SUMMARY.end)[0].strip("\n").splitlines()
    assert 0 < len(summary) <= report.SUMMARY_MAX_LINES
    assert any(f"- {suite}:" in line for suite in result["summary"] for line in summary)
    assert "[docs/performance.md](docs/performance.md)" in summary[-1]
    # Hand-written notes on the page survive a second run; the generated part is replaced, not repeated.
    (tmp_path / "docs" / "performance.md").write_text(page.replace("# Performance", "# Performance\n\nMy notes."))
    assert _bench("--out", "out", "--readme", "README.md") == 0  # the older form, a path
    again = (tmp_path / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "My notes." in again and again.count("| suite |") == 1
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == readme


def test_readme_option_with_a_path_writes_the_page_beside_that_readme(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(README_TEXT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert _bench("--out", "out", "--readme", "repo/README.md") == 0
    assert (repo / "docs" / "performance.md").exists() and not (tmp_path / "docs").exists()


@pytest.mark.parametrize("broken", ["readme-markers", "page-markers", "no-readme"])
def test_readme_option_refuses_missing_markers_before_writing_anything(tmp_path, monkeypatch, capsys, broken):
    if broken != "no-readme":
        text = README_TEXT if broken == "page-markers" else README_TEXT.replace(report.SUMMARY.end, "")
        (tmp_path / "README.md").write_text(text, encoding="utf-8")
    if broken == "page-markers":
        (tmp_path / "docs").mkdir()
        (tmp_path / "docs" / "performance.md").write_text("# Performance\n\nnotes only\n", encoding="utf-8")
    before = {p: p.read_text() for p in tmp_path.rglob("*.md")}
    monkeypatch.chdir(tmp_path)
    assert _bench("--out", "out", "--readme") == 1  # a runtime failure (the file), not a usage error
    err = capsys.readouterr().err
    assert "error:" in err and "fix:" in err
    assert {p: p.read_text() for p in tmp_path.rglob("*.md")} == before and not (tmp_path / "out").exists()


def test_summary_stays_within_ten_lines_however_many_suites():
    result = json.loads(QUICK_JSON.read_text())
    suite = next(iter(result["summary"].values()))
    result["summary"] = {f"suite{i}": suite for i in range(12)}
    lines = report.summary(result).splitlines()
    assert len(lines) == report.SUMMARY_MAX_LINES and "5 more suites" in lines[-3] and lines[-2].startswith("- goals:")


def test_a_profile_without_a_draft_is_refused_by_name(tmp_path, capsys):
    """The bench compares speculative modes against `off`: a profile with no draft model is a
    one-line error naming the profile, not an 'invalid model id None'."""
    from localspec.cli import main
    from tests.common import TARGET_ID
    from tests.models_helpers import write_overlay

    write_overlay(f'[profiles.solo]\ntarget = "{TARGET_ID}"\n')
    assert main(["bench", "--quick", "--profile", "solo", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "'solo' has no draft model" in err and "None" not in err, err
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- bench --noisy: the CPU hog

def test_hog_schedule_on_a_simulated_clock_is_a_full_core_then_half():
    from localspec.bench.hog import HogSchedule, run

    now = [0.0]
    spun_in: dict[str, float] = {"full": 0.0, "duty": 0.0}

    def spin(s: float) -> None:
        spun_in["full" if now[0] < 60 else "duty"] += s
        now[0] += s

    def sleep(s: float) -> None:
        now[0] += s

    schedule = HogSchedule(full_s=60, busy_ms=50, idle_ms=50)
    spun = run(schedule, alive=lambda: now[0] < 120, clock=lambda: now[0], spin=spin, sleep=sleep)
    assert spun_in["full"] == pytest.approx(60, abs=0.05)  # every second of the first minute
    assert spun_in["duty"] == pytest.approx(30, abs=0.1)  # half of the next
    assert spun == pytest.approx(90, abs=0.1) and schedule.duty == 0.5
    assert "100% for the first 60 s" in schedule.describe() and "50 ms busy / 50 ms idle" in schedule.describe()


def test_hog_never_outlives_its_bound():
    from localspec.bench.hog import HogSchedule, run

    now = [0.0]

    def tick(s: float) -> None:
        now[0] += s

    run(HogSchedule(full_s=1, max_s=5), alive=lambda: True, clock=lambda: now[0], spin=tick, sleep=tick)
    assert 5 <= now[0] < 5.2


def test_hog_is_a_child_process_stopped_and_reaped_when_the_bench_fails():
    from localspec.bench.hog import CpuHog, HogSchedule

    hog = CpuHog(HogSchedule(full_s=0.2, busy_ms=10, idle_ms=10))
    with pytest.raises(RuntimeError, match="bench failed"), hog:
        proc = hog.proc
        assert proc is not None and proc.poll() is None and proc.pid != __import__("os").getpid()
        raise RuntimeError("bench failed")
    assert hog.proc is None and proc.returncode is not None  # reaped: no zombie left behind
    assert hog.usage is not None and hog.usage.wall_s > 0 and hog.stop() is hog.usage  # stopping twice is harmless


def test_hog_exits_by_itself_when_its_parent_is_gone():
    """A bench killed without cleanup (SIGKILL) must not leave a core spinning: the hog watches its parent."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "localspec.bench.hog", "--parent", "1", "--max-s", "600"],
                         timeout=120, capture_output=True)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------- bench --plan goals

def test_goals_plan_is_issue_31s_named_plan():
    plan = runner.goals_plan()
    suites = runner.load_suites()
    assert plan.name == "goals" and plan.suites == ["editing", "code"]
    assert [m.mode for m in plan.modes] == ["off", "lookup", "auto"]
    assert plan.max_tokens == 256 and plan.repeats == 3 and plan.interleave_servers
    assert plan.prompts("editing", suites) == suites["editing"]["prompts"]  # P2: every shipped editing prompt
    assert 0 < len(plan.prompts("code", suites)) == runner.GOALS_CODE_PROMPTS <= len(suites["code"]["prompts"])
    assert [c["name"] for c in plan.llama_server_configs] == ["ngram-simple", "ngram-mod"]
    assert not plan.ttft and not plan.python_anchor
    assert runner.PLANS["quick"] is runner.quick_plan and runner.quick_plan().max_tokens == 64


def _bench_args(*argv: str):
    import argparse

    from localspec.cli import bench_cmd

    parser = argparse.ArgumentParser()
    bench_cmd.register(parser.add_subparsers())
    return parser.parse_args(["bench", *argv])


def test_plan_options_select_and_shrink_a_plan():
    from localspec.cli.bench_cmd import select_plan
    from localspec.errors import ConfigError

    plan = select_plan(_bench_args("--plan", "goals", "--prompts", "1", "--max-tokens", "16", "--repeats", "1"))
    suites = runner.load_suites()
    assert plan.name == "goals" and plan.max_tokens == 16 and plan.repeats == 1
    assert [len(plan.prompts(s, suites)) for s in plan.suites] == [1, 1]
    assert select_plan(_bench_args("--quick")).name == "quick" == select_plan(_bench_args("--plan", "quick")).name
    assert select_plan(_bench_args()).name == "full"
    with pytest.raises(ConfigError, match="two plans"):
        select_plan(_bench_args("--quick", "--plan", "goals"))
    assert _bench_args("--plan", "goals", "--noisy").noisy


def test_an_unknown_suite_is_a_usage_error_naming_the_known_ones(tmp_path, capsys):
    from localspec.cli import main
    from localspec.cli.bench_cmd import select_plan

    assert select_plan(_bench_args("--suites", "code, chat")).suites == ["code", "chat"]
    assert select_plan(_bench_args("--plan", "predicted", "--suites", "predicted")).suites == ["predicted"]
    # A missing profile would fail with status 1 when the models are looked up: 2 means refused first.
    assert main(["bench", "--suites", "code,nope", "--no-anchors", "--profile", "no-such-profile",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == ("error: Unknown suite 'nope' in --suites.\n"
                   "  fix: Pick from code, chat, editing, long (comma-separated).\n")


class _FakeEngine:
    """Answers every request at a speed set by its mode; counts exploration like the engine will."""

    class target:  # noqa: N801 - stands in for the runtime attribute
        chat_template = None

    def __init__(self, explored: bool) -> None:
        self.explored = explored

    def generate(self, request):
        from localspec.engine.events import Done, Stats

        stats = Stats(mode=request.mode, completion_tokens=request.max_tokens, decode_ms=1000.0)
        if self.explored:
            stats.explored = 2
        yield Done("length", stats, "x")


class _FakeServers:
    modes = ["llama-server:off", "llama-server:ngram-simple"]

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int, int]] = []

    def complete(self, mode, suite, pid, rep, prompt, max_tokens):
        self.calls.append((mode, suite, pid, rep))
        return {"suite": suite, "prompt": pid, "rep": rep, "mode": mode, "engine": "llama-server",
                "tokens": max_tokens, "tps": 10.0, "drafted": 0, "accepted": 0}


@pytest.mark.parametrize("explored", [False, True])
def test_interleaved_plan_pairs_llama_server_with_our_modes_in_every_repeat(explored):
    plan = runner.BenchPlan(suites=["editing"], modes=[runner.ModeSpec("off", "off"), runner.ModeSpec("auto", "auto")],
                            prompts_per_suite=2, repeats=3, max_tokens=16)
    servers = _FakeServers()
    ticks: list[str] = []
    runs = runner.run_modes(_FakeEngine(explored), plan, ticks.append, servers=servers)  # type: ignore[arg-type]
    assert len(runs) == len(ticks) == 2 * 3 * 4
    assert sorted(servers.calls) == sorted((m, "editing", p, r) for m in servers.modes for p in (0, 1) for r in range(3))
    summary = runner.summarize(runs)
    assert summary["editing"]["llama-server:ngram-simple"]["paired_runs"] == 6
    assert summary["editing"]["auto"]["explored_per_1k"] == (pytest.approx(1000 * 2 / 16) if explored else 0.0)
    from localspec.bench import goals

    assert goals.exploration(summary) == ({"editing": pytest.approx(125.0)} if explored else {"editing": 0.0})


# ---------------------------------------------------------------- #31's goals on synthetic runs

def _synthetic_runs() -> list[dict]:
    """Editing: 2 prompts, code: 1; 3 repeats. Each speed is base x factor, with a noisy repeat."""
    speed = {  # mode -> (editing #0, editing #1, code #0) factors over off
        "off": (1.0, 1.0, 1.0), "lookup": (1.7, 1.5, 1.0), "auto": (1.6, 1.4, 0.98),
        "llama-server:off": (1.0, 1.0, 1.01), "llama-server:ngram-simple": (1.4, 1.45, 1.0),
        "llama-server:ngram-mod": (1.3, 1.3, 0.9),
    }
    runs = []
    for rep in range(3):
        noise = 0.5 if rep == 1 else 1.0  # a repeat where the machine was busy, for every mode alike
        for mode, factors in speed.items():
            for (suite, pid), f in zip((("editing", 0), ("editing", 1), ("code", 0)), factors, strict=True):
                # One outlier run of auto on editing #0: the median over repeats ignores it.
                odd = 0.5 if (mode, suite, pid, rep) == ("auto", "editing", 0, 2) else 1.0
                runs.append({"suite": suite, "prompt": pid, "rep": rep, "mode": mode, "tps": 30.0 * f * noise * odd,
                             "tokens": 100, "drafted": 0, "accepted": 20 if "ngram" in mode and suite == "editing" else 0})
    return runs


def test_goals_are_medians_of_paired_repeats_with_each_bar_checked():
    summary = runner.summarize(_synthetic_runs())
    g = runner.goals(summary, None, None, None)
    checks = {name: {c["what"]: c for c in goal["checks"]} for name, goal in g.items() if "checks" in goal}
    # P1: per prompt the median of 3 paired ratios (the outlier repeat does not move it); per suite
    # the median of its prompts.
    assert checks["P1"]["editing #0"]["value"] == pytest.approx(1.6) and checks["P1"]["editing #0"]["pairs"] == 3
    assert checks["P1"]["editing suite"]["value"] == pytest.approx(1.5)
    assert checks["P1"]["code suite"]["value"] == pytest.approx(0.98) and checks["P1"]["code suite"]["met"]
    assert g["P1"]["value"] == pytest.approx(0.98) and g["P1"]["met"] and not g["P1"]["indicative"]
    # P2: 1.5x off on editing (met at exactly 1.5), and >= 0.9x lookup per prompt: 1.6/1.7 and 1.4/1.5.
    assert g["P2"]["value"] == pytest.approx(1.5) and g["P2"]["met"]
    assert checks["P2"]["editing #1 vs lookup"]["value"] == pytest.approx(1.4 / 1.5)
    # P3: editing's best config is ngram-simple (median 1.425x off); auto's median over it is
    # (1.6/1.4 + 1.4/1.45)/2 = 1.054 < 1.1: not met. Prompt #1 against its best (1.45) is < 1.0.
    assert g["P3"]["value"]["editing"] == pytest.approx((1.6 / 1.4 + 1.4 / 1.45) / 2)
    assert checks["P3"]["editing suite vs ngram-simple"]["met"] is False and g["P3"]["met"] is False
    assert checks["P3"]["editing #0 vs its best config"]["value"] == pytest.approx(1.6 / 1.4)
    assert checks["P3"]["editing #1 vs its best config"]["value"] == pytest.approx(1.4 / 1.45)
    # Code: its best is plain decoding (1.01x, drafts 0%), so auto must reach 0.97x of it.
    code = checks["P3"]["code suite vs off (drafts 0% of its tokens)"]
    assert code["value"] == pytest.approx(0.98 / 1.01) and code["bar"] == 0.97 and code["met"]
    # Not measured here: TTFT and memory.
    assert g["P5"]["met"] is None and g["P7"]["met"] is None


def test_p3_sets_no_bar_on_a_suite_where_llama_servers_best_drafts_much():
    runs = [r for r in _synthetic_runs() if r["suite"] == "code"]
    for r in runs:
        if r["mode"] == "llama-server:off":
            r["tps"] *= 0.5  # ngram-simple is now the best on code, and 20% of its tokens are drafts
        if r["mode"] == "llama-server:ngram-simple":
            r["accepted"] = 20
    g = runner.goals(runner.summarize(runs), None, None, None)
    (check,) = g["P3"]["checks"]
    assert check["what"] == "code suite vs ngram-simple (drafts 20% of its tokens: no bar)" and check["bar"] is None
    assert g["P3"]["met"] is None and g["P2"]["met"] is None  # no editing suite: P2 not measured


def test_goals_from_fewer_than_three_repeats_are_marked_indicative():
    runs = [r for r in _synthetic_runs() if r["rep"] == 0]
    g = runner.goals(runner.summarize(runs), None, None, None)
    assert g["P1"]["indicative"] and g["P1"]["min_pairs"] == 1


def test_report_says_the_run_was_noisy_and_lists_every_check():
    from localspec.bench.hog import HogSchedule, HogUsage

    runs = _synthetic_runs()
    summary = runner.summarize(runs)
    result = {
        "schema": runner.SCHEMA_VERSION, "machine": runner.machine(), "command": "localspec bench --plan goals --noisy",
        "plan": runner.goals_plan().to_json(), "runs": runs, "summary": summary, "acceptance_by_position": {},
        "goals": runner.goals(summary, None, None, None), "exploration": {"editing": 3.5},
        "noisy": {"schedule": HogSchedule().to_json(), "calibration": "fresh (auto calibrated under the hog)",
                  "usage": HogUsage(100.0, 55.0).to_json()},
    }
    md = report.markdown(json.loads(json.dumps(result)))
    assert "Noisy run: a CPU hog beside the engine, one core at 100% for the first 60 s" in md
    assert "the hog used 55.0 CPU-s over 100.0 s" in md
    assert "| P2 | editing #1 vs lookup | 0.933x | >= 0.90x | 3 | met |" in md
    assert "| P3 | editing suite vs ngram-simple |" in md and "P5: second-turn TTFT" in md and "not measured" in md
    assert "explored steps per 1k tokens: editing 3.5" in md
    assert "P3 not met" in report.summary(result)


def test_the_first_repeat_is_reported_apart_from_later_ones_that_can_copy_an_earlier_answer():
    from localspec.bench import goals

    def row(prompt, rep, mode, tps):
        return {"suite": "code", "prompt": prompt, "rep": rep, "mode": mode, "tps": tps}

    runs = [row(p, r, "off", 30.0) for p in (0, 1) for r in (0, 1, 2)]
    runs += [row(0, 0, "llama-server:ngram-mod", 27.0), row(1, 0, "llama-server:ngram-mod", 33.0),
             row(0, 1, "llama-server:ngram-mod", 60.0), row(1, 2, "llama-server:ngram-mod", 66.0),
             row(0, 0, "auto", 33.0), row(1, 0, "auto", 36.0), row(0, 2, "auto", 60.0)]
    first = goals.first_repeat(runs)
    assert first == {"code": {"auto": pytest.approx(1.15), "llama-server:ngram-mod": pytest.approx(1.0)}}
    result = {"schema": runner.SCHEMA_VERSION, "machine": runner.machine(), "command": "c",
              "plan": runner.goals_plan().to_json(), "runs": runs, "summary": runner.summarize(runs),
              "acceptance_by_position": {}, "goals": {}, "first_repeat": first}
    md = report.markdown(json.loads(json.dumps(result)))
    assert "- first repeat only, code (no earlier answer to copy; ratio to `off`): auto 1.15x, " \
           "llama-server:ngram-mod 1.00x" in md


FAKE_SERVER = '''#!{python}
"""Stands in for llama-server: /health, and /completion with timings; refuses ngram-mod."""
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
if "ngram-mod" in args:
    sys.exit(3)
spec = args[args.index("--spec-type") + 1] if "--spec-type" in args else "off"


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply({{"status": "ok"}})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = req["n_predict"]
        self._reply({{"timings": {{"predicted_n": n, "predicted_per_second": 40.0 if spec == "off" else 50.0,
                                  "prompt_ms": 5.0, "draft_n": 0 if spec == "off" else n, "draft_n_accepted": n // 2,
                                  "threads": args[args.index("-t") + 1]}}}})


HTTPServer(("127.0.0.1", int(args[args.index("--port") + 1])), H).serve_forever()
'''


def test_server_pool_keeps_one_server_per_config_and_reports_one_that_fails(tmp_path):
    import sys

    from localspec.bench.anchors import LlamaServerPool

    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_SERVER.format(python=sys.executable))
    binary.chmod(0o755)
    configs = [{"name": t, "args": ["--spec-type", t], "draft": False} for t in ("ngram-simple", "ngram-mod")]
    with LlamaServerPool(str(binary), tmp_path / "t.gguf", None, configs, n_ctx=512, threads=2) as pool:
        assert pool.modes == ["llama-server:off", "llama-server:ngram-simple"]
        assert [e["mode"] for e in pool.errors] == ["llama-server:ngram-mod"]
        procs = [p for p, _ in pool._procs.values()]
        row = pool.complete("llama-server:ngram-simple", "editing", 3, 2, "rendered", 16)
        off = pool._procs["llama-server:off"][0]
        off.kill()
        off.wait()
        dead = pool.complete("llama-server:off", "editing", 3, 2, "rendered", 16)  # an error row, not a crash
        assert dead["suite"] == "error" and "exited" in dead["error"] and dead["rep"] == 2
    assert row == {"suite": "editing", "prompt": 3, "rep": 2, "mode": "llama-server:ngram-simple",
                   "engine": "llama-server", "tokens": 16, "tps": 50.0, "ttft_ms": 5.0, "drafted": 16, "accepted": 8}
    assert all(p.returncode is not None for p in procs)  # stopped and reaped on leaving the block


def test_the_bar_counts_a_step_once_it_is_over_so_the_last_one_keeps_its_clock_running():
    """Each step ticks as it starts: the bar read 7/7 with its clock stopped while the last step (the
    long prompt's prefill, minutes on a loaded 2-core box) still ran, so the bench looked hung."""
    from localspec.cli.bench_cmd import progress_bar

    with progress_bar(2) as bar:
        task = bar._bar.tasks[0]
        bar.tick("first")
        assert task.completed == 0 and task.description == "first"
        bar.tick("last")
        assert task.completed == 1 and not task.finished  # the last step runs: its clock runs too
    assert task.completed == 2 and task.finished


def test_full_plan_interleaves_the_ngram_configurations_p3_weighs_and_runs_the_draft_sweep_apart():
    """Run apart, a configuration is timed minutes after our modes and its ratio carries the box's drift."""
    pooled, apart = runner.server_split(runner.full_plan())
    assert [c["name"] for c in pooled] == ["ngram-simple", "ngram-mod", "ngram-map-k"]
    assert [c["name"] for c in apart] and all(c["draft"] for c in apart)  # the draft-model sweep
    goals_pooled, goals_apart = runner.server_split(runner.goals_plan())
    assert [c["name"] for c in goals_pooled] == ["ngram-simple", "ngram-mod"] and goals_apart == []
    assert runner.server_split(runner.quick_plan())[0] == []


def test_configurations_run_apart_leave_out_target_only_when_the_pool_ran_it(tmp_path):
    import sys

    from localspec.bench.anchors import llama_server

    binary = tmp_path / "llama-server"
    binary.write_text(FAKE_SERVER.format(python=sys.executable))
    binary.chmod(0o755)
    configs = [{"name": "ngram-simple", "args": ["--spec-type", "ngram-simple"], "draft": False}]
    prompts = [("editing", 0, "Fix this.")]
    run = lambda **kw: llama_server(str(binary), tmp_path / "t.gguf", None, configs, prompts, 16, 512, 2,  # noqa: E731
                                    None, lambda _: None, **kw)
    assert [r["mode"] for r in run()] == ["llama-server:off", "llama-server:ngram-simple"]
    assert [r["mode"] for r in run(with_off=False)] == ["llama-server:ngram-simple"]
