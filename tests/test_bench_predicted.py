"""`localspec bench --plan predicted` (issue #26): the edit tasks, the plan's runs on the scripted
engine, and the report's ratios, ceiling, identity and goals (no weights; speed belongs to the bench)."""

from __future__ import annotations

import ast
import json
from pathlib import PurePath

import pytest

from localspec.bench import edits, predicted, report, runner
from localspec.bench.edits import BenchItem, EditBenchTask, Outcome, Tie
from localspec.engine.events import Done, Stats
from tests.fake_tier import scripted, scripted_costs, scripted_engine

# ---------------------------------------------------------------- the shipped tasks

ISSUE_SHAPES = {"rename across a file", "add types", "fix one line", "reorder functions", "translate comments",
                "large change"}


def test_every_shipped_task_is_a_valid_file_with_an_instruction():
    tasks = edits.load_tasks()
    assert 6 <= len(tasks) <= 8 and len({t.id for t in tasks}) == len(tasks)
    assert {t.shape for t in tasks} >= ISSUE_SHAPES
    suffixes = [PurePath(t.file).suffix for t in tasks]
    assert suffixes.count(".py") >= len(tasks) - 2 and set(suffixes) - {".py"}, "mostly Python, one other language"
    for t in tasks:
        assert t.instruction.strip() and t.text.endswith("\n"), t.id
        assert 30 <= len(t.text.splitlines()) <= 60, (t.id, len(t.text.splitlines()))
        if t.file.endswith(".py"):
            ast.parse(t.text, filename=t.file)  # a SyntaxError fails the test
        edit = t.edit()
        assert edit.prediction() in edit.messages()[-1].content  # the file as the prompt shows it


@pytest.mark.parametrize("raw, wrong", [
    ({}, "non-empty list 'tasks'"),
    ({"tasks": [{"id": "a", "shape": "s", "file": "f.py", "text": "x = 1\n"}]}, "task 0 needs"),
    ({"tasks": [{"id": "a", "shape": "s", "file": "f.py", "text": "x\n", "instruction": "  "}]}, "task 0 needs"),
    ({"tasks": [{"id": "a", "shape": "s", "file": "f.py", "text": "x\n", "instruction": "i"}] * 2}, "repeat"),
])
def test_malformed_task_data_is_refused_by_name(raw, wrong):
    with pytest.raises(ValueError, match=wrong):
        edits.parse_tasks(raw)


def test_the_code_in_a_shipped_editing_prompt_is_its_prediction():
    for prompt in runner.load_suites()["editing"]["prompts"]:
        code = edits.code_in(prompt)
        assert code is not None and code.startswith("```") and code.endswith("```")
        assert code in prompt  # the block as the prompt holds it, fences included
    assert edits.code_in("Explain closures.") is None
    two = "Merge these.\n\n```python\na = 1\n```\nand\n~~~~js\nlet b = 2;\n~~~~\n"
    assert edits.code_in(two) == "```python\na = 1\n```\n\n~~~~js\nlet b = 2;\n~~~~"


def test_the_predicted_plan_and_its_smoke_form():
    from tests.test_bench import _bench_args

    from localspec.cli.bench_cmd import select_plan

    plan = runner.PLANS["predicted"](None)
    assert plan.workload is runner.Workload.EDITS and plan.repeats == 2 and plan.suites == ["predicted", "editing"]
    assert [m.name for m in plan.modes_for("predicted")] == ["off", "lookup", "auto", "auto+prediction"]
    assert [m.name for m in plan.modes_for("editing")] == ["off", "auto", "auto+prediction"]
    assert [m.name for m in plan.modes if m.prediction] == ["auto+prediction"]
    count = len  # bytes stand in for tokens
    items = edits.plan_items(plan, count)
    assert [i.suite for i in items].count("predicted") == len(edits.load_tasks())
    assert [i.suite for i in items].count("editing") == len(runner.load_suites()["editing"]["prompts"])
    # max_tokens 0: each reply's budget as `localspec edit` sizes it.
    from localspec.cli.edit_cmd import reply_budget

    first = edits.load_tasks()[0]
    assert items[0].max_tokens == reply_budget(len(first.text), None) and items[0].prediction == first.edit().prediction()
    smoke = select_plan(_bench_args("--plan", "predicted", "--prompts", "1", "--repeats", "1"))
    assert [(i.suite, i.key) for i in edits.plan_items(smoke, count)] == [("predicted", first.id), ("editing", "0")]
    assert smoke.repeats == 1
    capped = select_plan(_bench_args("--plan", "predicted", "--max-tokens", "40"))
    assert {i.max_tokens for i in edits.plan_items(capped, count)} == {40}


def _item(suite="predicted", key="t", prompt_tokens=100, max_tokens=300) -> BenchItem:
    return BenchItem(suite=suite, key=key, messages=(), prediction="p", max_tokens=max_tokens,
                     prompt_tokens=prompt_tokens)


def test_the_context_fits_the_largest_edit():
    from localspec.errors import ConfigError

    small, large = _item(key="a"), _item(key="b", prompt_tokens=3000, max_tokens=2000)
    assert edits.context_for([small], floor=4096, trained=32768) == 4096
    assert edits.context_for([small, large], floor=4096, trained=32768) == 5120  # 5000 rounded up to 256s
    assert edits.context_for([small, large], floor=4096, trained=5000) == 5000
    assert edits.context_for([small, large], floor=4096, trained=None) == 5120  # unknown: no bound
    with pytest.raises(ConfigError, match="predicted b needs 5,000 tokens"):
        edits.context_for([large], floor=4096, trained=4999)
    with pytest.raises(ConfigError, match="no edits"):
        edits.context_for([], floor=4096, trained=4999)


# ---------------------------------------------------------------- the plan on the scripted engine

RENAME = EditBenchTask(id="rename", shape="rename across a file", file="area.py",
                       text="def area(w, h):\n    return w * h\n\n\nprint(area(2, 3))\n",
                       instruction="Rename area to surface.")
TYPES = EditBenchTask(id="types", shape="add types", file="double.py",
                      text="def double(x):\n    return x * 2\n\n\ndef triple(x):\n    return x * 3\n",
                      instruction="Add type hints.")
ANSWERS = {
    "Rename area": "```python\ndef surface(w, h):\n    return w * h\n\n\nprint(surface(2, 3))\n```",
    "Add type hints": "```python\ndef double(x: int) -> int:\n    return x * 2\n\n\ndef triple(x: int) -> int:\n"
                      "    return x * 3\n```",
}


def _run_plan(repeats: int = 2):
    engine = scripted_engine(script=scripted(ANSWERS), mode="auto", parallel=1, n_ctx=2048)
    seen = []
    generate = engine.generate

    def spy(request):
        seen.append(request)
        return generate(request)

    engine.generate = spy  # type: ignore[method-assign]
    plan = runner.predicted_plan()
    plan.repeats = repeats
    items = [edits.task_item(t, len) for t in (RENAME, TYPES)]
    ticks: list[str] = []
    outcomes = edits.run_items(engine, plan, items, ticks.append)
    return engine, items, outcomes, seen, ticks


def test_the_plan_runs_every_mode_per_edit_interleaved_and_only_auto_prediction_predicts():
    engine, items, outcomes, seen, ticks = _run_plan()
    modes = [m.name for m in runner.PREDICTED_MODES]
    assert len(outcomes) == len(seen) == len(ticks) == 2 * 2 * len(modes)
    blocks = [outcomes[i:i + len(modes)] for i in range(0, len(outcomes), len(modes))]
    for block in blocks:  # one edit and repeat: its modes back to back, each once
        assert len({(o.item.key, o.rep) for o in block}) == 1 and sorted(o.mode for o in block) == sorted(modes)
    assert len({tuple(o.mode for o in b) for b in blocks}) > 1, "the modes' order is shuffled per edit"
    for o, request in zip(outcomes, seen, strict=True):
        assert request.sampling.greedy and request.max_tokens == o.item.max_tokens
        assert request.messages == list(o.item.messages)
        assert request.mode == ("off" if o.mode == "off" else "lookup" if o.mode == "lookup" else "auto")
        assert request.prediction == (o.item.prediction if o.mode == "auto+prediction" else None)
        # Every ask a first ask: no repeat copies an earlier repeat's answer through lookup's history.
        assert request.history_scope == f"bench:{o.mode}:{o.rep}"
        row = o.row()
        assert (row["prediction_drafted"] > 0) == (o.mode == "auto+prediction"), row
        assert row["text"] == ANSWERS["Rename area" if o.item.key == "rename" else "Add type hints"]
    again = edits.run_items(scripted_engine(script=scripted(ANSWERS), mode="auto", parallel=1, n_ctx=2048),
                            runner.predicted_plan(), items, lambda _: None)
    assert [o.mode for o in again] == [o.mode for o in outcomes], "a fixed seed: the same order every run"
    same = edits.identity(outcomes, edits.tie_check(engine))
    assert same.compared == 2 * 2 * 3 and same.differences == []  # lossless on the scripted model


def test_the_near_tie_check_reads_the_targets_logits_and_leaves_the_engine_answering():
    engine, items, outcomes, _, _ = _run_plan(repeats=1)
    off = next(o for o in outcomes if o.mode == "off" and o.item.key == "rename")
    ref = list(off.generated.ids)
    got = [*ref[:9], ord("X"), *ref[10:]]  # the scripted target is sure of every byte: margin 30
    tie = edits.tie_check(engine)(off.item, ref, got, 9)
    assert tie is not None and tie.gap == pytest.approx(30.0) and not tie.top_two
    ended = edits.tie_check(engine)(off.item, ref, ref[:9], 9)  # got stopped early: not a tie either
    assert ended is not None and not ended.top_two
    after = runner.run_request(engine, off.item.request(edits.OFF))
    assert after.done.text == off.generated.done.text and after.ids == off.generated.ids


def _generated(text: str, ids: tuple[int, ...]) -> runner.Generated:
    return runner.Generated(Done("stop", Stats(), text), ids)


def test_an_identity_difference_is_reported_with_where_and_whether_it_is_a_near_tie():
    item = _item()
    outcomes = [Outcome(item, "off", 0, _generated("return a + b", (1, 2, 3, 4))),
                Outcome(item, "auto", 0, _generated("return a + c", (1, 2, 3, 5))),
                Outcome(item, "lookup", 0, _generated("return a + b", (1, 2, 3, 4)))]
    calls = []

    def check(it, ref, got, at):
        calls.append((it.key, tuple(ref), tuple(got), at))
        return Tie(gap=0.2, top_two=True)

    found = edits.identity(outcomes, check)
    assert found.compared == 2 and calls == [("t", (1, 2, 3, 4), (1, 2, 3, 5), 3)]
    (d,) = found.differences
    assert (d.mode, d.token, d.char, d.off, d.got) == ("auto", 3, 11, "return a + b", "return a + c")
    assert d.near_tie is True and predicted.identity_goal(found.to_json())["met"] is True
    # Close, but the answers' tokens are not the target's two best: no near-tie.
    assert edits.identity(outcomes, lambda *a: Tie(gap=0.1, top_two=False)).differences[0].near_tie is False
    far = edits.identity(outcomes, lambda *a: Tie(gap=2.5, top_two=True))
    assert far.differences[0].near_tie is False and predicted.identity_goal(far.to_json())["met"] is False
    unchecked = edits.identity(outcomes)
    assert unchecked.differences[0].near_tie is None and predicted.identity_goal(unchecked.to_json())["met"] is None
    assert predicted.identity_goal(edits.identity(outcomes[::2]).to_json())["met"] is True  # no difference
    md = "\n".join(predicted._identity_lines(far.to_json()))
    assert "2 answers compared with off's (same edit, same repeat); 1 differ." in md
    assert "predicted t repeat 0, auto: from token 3 (character 11)" in md and "NOT a near-tie" in md


# ---------------------------------------------------------------- ceiling and goals


def test_expected_tokens_per_pass():
    assert predicted.expected_tokens(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert predicted.expected_tokens(0.0, 5) == 1.0
    assert predicted.expected_tokens(1.0, 7) == 8.0


def test_the_ceiling_is_the_best_draft_length_on_the_verify_curve():
    curve = {1: 1.0, 2: 1.5, 3: 2.0, 4: 3.0, 5: 4.5}
    c = predicted.ceiling(0.8, lambda n: curve[n], k_max=4)
    # per token: k=1: 0.8 * 1.5 / 2 + 0.2 = 0.8; k=2: 0.8 * 2.0 / 3 + 0.2 = 0.733; k=3: 0.8 * 3 / 4 + 0.2 = 0.8;
    # k=4: 0.8 * 4.5 / 5 + 0.2 = 0.92: k=2 is best, 1 / 0.7333 = 1.364x
    assert (c.k, c.tokens_per_pass, c.verify_steps) == (2, 3.0, 2.0) and c.speedup == pytest.approx(1 / (0.8 * 2 / 3 + 0.2))
    flat = predicted.ceiling(0.9, lambda n: 1.0, k_max=16)  # a GPU-like flat curve: the longest draft wins
    assert flat.k == 16 and flat.speedup == pytest.approx(1 / (0.9 / 17 + 0.1))
    none = predicted.ceiling(0.0, lambda n: 1.0 + n)  # nothing given: not drafting is the best
    assert (none.k, none.speedup) == (0, 1.0)
    steep = predicted.ceiling(1.0, lambda n: float(n))  # every extra row costs a step: drafting never pays
    assert (steep.k, steep.speedup) == (0, 1.0)


def _row(key: str, mode: str, rep: int, tps: float, **kw) -> dict:
    return {"suite": "predicted", "prompt": key, "rep": rep, "mode": mode, "tps": tps, "tokens": 101,
            "drafted": 0, "accepted": 0, "prompt_tokens": 400, "target_passes": 100, "prediction_drafted": 0,
            "prediction_accepted": 0, "text": "x", **kw}


SPEEDS = {  # task -> mode -> tokens/s (off 10)
    "A": {"off": 10.0, "lookup": 12.0, "auto": 12.0, "auto+prediction": 25.0},
    "B": {"off": 10.0, "lookup": 15.0, "auto": 14.0, "auto+prediction": 20.0},
    "C": {"off": 10.0, "lookup": 10.0, "auto": 11.0, "auto+prediction": 9.5},
}


def _synthetic_rows() -> list[dict]:
    rows = []
    for rep in range(2):
        busy = 0.5 if rep == 1 else 1.0  # a slow repeat for every mode alike: paired ratios ignore it
        for key, by_mode in SPEEDS.items():
            for mode, tps in by_mode.items():
                extra = {"prediction_drafted": 100, "prediction_accepted": 90, "target_passes": 20} \
                    if mode == "auto+prediction" else {}
                rows.append(_row(key, mode, rep, tps * busy, **extra))
    return rows


def test_ratios_medians_and_the_worst_task_against_the_goals():
    summary = runner.summarize(_synthetic_rows())
    g = predicted.goals(summary, None, {"compared": 18, "differences": []})
    checks = {c["what"]: c for goal in g.values() for c in goal["checks"]}
    assert g["vs off"]["value"] == pytest.approx(2.0) and g["vs off"]["met"]  # median of 2.5, 2.0, 0.95
    assert checks["predicted #A"]["value"] == pytest.approx(2.5) and checks["predicted #A"]["pairs"] == 2
    assert g["vs lookup"]["value"] == pytest.approx(20 / 15) and g["vs lookup"]["met"]  # of 2.08, 1.33, 0.95
    assert g["worst task"]["value"] == pytest.approx(0.95) and g["worst task"]["met"] is False
    assert checks["predicted #C"]["met"] is False and checks["predicted #B"]["met"] is True
    assert g["identity"]["met"] is True and not g["vs off"]["indicative"]  # 2 repeats are what the plan wants


def test_the_speedup_goal_becomes_85_percent_of_a_ceiling_below_1_8():
    assert predicted.speedup_bar(None) == predicted.speedup_bar(2.5) == 1.8
    assert predicted.speedup_bar(1.5) == pytest.approx(1.275)
    rows = [r for r in _synthetic_rows() if r["prompt"] != "A"]  # auto+prediction: 2.0x and 0.95x, median 1.475
    summary = runner.summarize(rows)
    low = predicted.goals(summary, 1.7, {"compared": 0, "differences": []})["vs off"]
    assert low["checks"][0]["bar"] == pytest.approx(0.85 * 1.7) and low["met"] is True and "85% of the ceiling" in low["bar"]
    high = predicted.goals(summary, 2.4, {"compared": 0, "differences": []})["vs off"]
    assert high["checks"][0]["bar"] == 1.8 and high["met"] is False


def test_the_suite_ceiling_uses_the_measured_coverage_and_the_learned_curve():
    # auto+prediction: 80 of 101 answer tokens from accepted drafts (the prediction's 90 of its drafts
    # were counted apart; lookup's count too: both copy the file)
    rows = [{**r, "accepted": 80} if r["mode"] == "auto+prediction" else r for r in _synthetic_rows()]
    share, source = predicted.coverage(rows, "predicted")
    assert share == pytest.approx(80 / 101) and source == "accepted drafts over answer tokens, median of 3 edits"
    costs = scripted_costs()  # verify(n) = 0.010 + 0.001 (n - 1): verify(k + 1) / verify(1) = 1 + 0.1 k
    c = predicted.suite_ceiling(rows, "predicted", costs)
    assert c is not None and c.covered == pytest.approx(80 / 101)
    f = 80 / 101
    best = max(range(1, 17), key=lambda k: 1 / (f * (1 + 0.1 * k) / (k + 1) + 1 - f))
    assert c.k == best and c.speedup == pytest.approx(1 / (f * (1 + 0.1 * best) / (best + 1) + 1 - f))
    assert predicted.suite_ceiling([r for r in rows if r["mode"] == "off"], "predicted", costs) is None
    assert predicted.coverage([{**r, "accepted": 0} for r in rows], "predicted") is None


def _edit_result(rows: list[dict]) -> dict:
    summary = runner.summarize(rows)
    identity = {"compared": 18, "differences": [
        {"suite": "predicted", "key": "C", "rep": 1, "mode": "auto", "token": 7, "char": 20, "off": "a + b",
         "got": "a + c", "tie": {"gap": 0.12, "top_two": True}, "near_tie": True}]}
    ceiling = predicted.ceiling(0.9, lambda n: 1 + 0.1 * (n - 1))
    return {"schema": runner.SCHEMA_VERSION, "machine": runner.machine(), "command": "localspec bench --plan predicted",
            "plan": runner.predicted_plan().to_json(), "runs": rows, "summary": summary,
            "acceptance_by_position": {}, "tasks": [{"id": k, "shape": f"shape {k}", "file": "f.py"} for k in SPEEDS],
            "ceiling": {"predicted": ceiling.to_json()}, "identity": identity,
            "goals": predicted.goals(summary, ceiling.speedup, identity)}


def test_the_report_tables_every_task_the_ceiling_identity_and_goals():
    shipped = [{**_row("0", mode, 0, tps), "suite": "editing"} for mode, tps in
               (("off", 10.0), ("auto", 13.0), ("auto+prediction", 16.0))]
    result = json.loads(json.dumps(_edit_result(_synthetic_rows() + shipped)))  # survives a JSON round trip
    md = predicted.markdown(result)
    # The shipped editing prompts: by index, no shape, no lookup.
    assert "| edit | off tok/s | auto | auto+prediction | prediction accepted / rejected |" in md
    assert "| #0 | 10.0 | 13.0 (1.30x) | 16.0 (1.60x) | 0 / 0, 1.0 tokens/pass |" in md
    assert "| edit | shape | off tok/s | lookup | auto | auto+prediction | auto+prediction / lookup |" in md
    # Task A: off's median over the repeats 7.5, auto+prediction 18.75 (2.50x), 25/12 over lookup;
    # 180 accepted and 20 rejected over 2 repeats, 200 tokens in 40 passes.
    assert "| A | shape A | 7.5 | 9.0 (1.20x) | 9.0 (1.20x) | 18.8 (2.50x) | 2.08x | 180 / 20, 5.0 tokens/pass |" in md
    assert "auto+prediction 2.00x" in md and "Worst edit for auto+prediction: C, 0.95x off." in md
    assert "- predicted: drafts gave 0% of the answer" not in md and "ceiling" in md
    assert "predicted C repeat 1, auto: from token 7 (character 20)" in md and "a proven near-tie, top-2 gap 0.120" in md
    assert "- worst task: auto+prediction >= 0.97x off on every task: 0.950 → not met" in md
    assert "| worst task | predicted #C | 0.950x | >= 0.97x | 2 | not met |" in md


def test_bench_redraws_an_edit_result_from_json_and_refuses_readme_for_it(tmp_path, capsys):
    from localspec.cli import main

    path = tmp_path / "bench.json"
    path.write_text(json.dumps(_edit_result(_synthetic_rows())))
    assert main(["bench", "--from-json", str(path), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "bench.md").read_text()
    assert "### predicted" in md and "### Greedy identity" in md
    assert report.check_schema(json.loads((tmp_path / "out" / "bench.json").read_text())) is None
    (tmp_path / "README.md").write_text("<!-- bench-summary:start -->\n<!-- bench-summary:end -->\n")
    assert main(["bench", "--from-json", str(path), "--out", str(tmp_path / "again"),
                 "--readme", str(tmp_path / "README.md")]) == 1
    assert "an edit plan's result" in capsys.readouterr().err and not (tmp_path / "again").exists()


def test_noisy_is_refused_for_the_edit_plan_before_any_model_loads(tmp_path, capsys):
    from localspec.cli import main

    assert main(["bench", "--plan", "predicted", "--noisy", "--out", str(tmp_path / "out")]) == 1
    assert "--noisy runs with the prompt plans" in capsys.readouterr().err and not (tmp_path / "out").exists()
