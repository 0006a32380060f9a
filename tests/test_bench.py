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
