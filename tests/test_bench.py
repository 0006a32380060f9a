"""Bench output has the schema its report reads (no timing assertions: speed belongs to the bench)."""

from __future__ import annotations

import json

import pytest

from localspec.bench import report, runner
from localspec.engine.config import EngineConfig
from localspec.engine.scheduler import Engine
from tests.conftest import TEST_THREADS


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
