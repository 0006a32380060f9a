"""Which signals of the small tier's own answer tell a cascade when to escalate? (issue #7)

The cascade (`localspec.router.cascade`) keeps the small tier's answer unless its mean token
log-probability is low or its code does not parse. This script measures that signal and others on
the shipped task set with RouteLLM's metrics, as `localspec router eval` does (APGR and CPT(50%),
bootstrap 95% intervals), escalating the tasks with the highest score first:

- confidence: mean and minimum token log-probability, the share of tokens below p = 0.5, an
  answer cut off at max_tokens;
- validity: code that does not parse or lacks the function the prompt names; no final number;
- self-consistency: N more answers sampled at temperature 0.7; the share that disagree with the
  greedy answer (another final number; other code, up to formatting and docstrings);
- the large model's view (`--teacher`): the small answer read by the 1.5B in one prefill (teacher
  forcing): its mean token log-probability, the share of tokens where its own greedy choice
  differs, and how much less likely it finds the answer than the small model did;
- all of them in one logistic regression, cross-validated on the same 5 folds as `router eval`.

It also reports the APGR of a perfect detector of the small tier's failures: the most that any
signal that predicts "the small answer is wrong" can reach on this task set.

The large tier's verdicts are the shipped outcomes (`evals/router/outcomes.json`). The
small tier is generated here (greedy like `router eval`, plus the samples) and kept in --work, so a
rerun only analyses. About 45 minutes on a 2-core CPU with --samples 2.

    python scripts/router_cascade_signals.py [--samples 2] [--parallel 4] [--teacher] [--out docs/router/cascade-signals.json]

--teacher adds about 25 minutes (one 1.5B prefill of prompt + answer per task), kept in its own work file.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import math
import re
from pathlib import Path

import numpy as np

from localspec.router.answers import extract_code, extract_number, parses
from localspec.router.checker import check
from localspec.router.curve import evaluate_router, routing_curve
from localspec.router.outcomes import OutcomeCache, generate_answers
from localspec.logistic import fit_logistic
from localspec.router.tasks import Task, kfold, load_tasks, shipped_outcomes

SIGNATURE = re.compile(r"`(\w+)\(")


def _read_work(work: Path) -> list[dict]:
    """The rows an earlier run kept (one JSON object a line), so a rerun only adds what is missing."""
    if not work.is_file():
        return []
    return [json.loads(line) for line in work.read_text(encoding="utf-8").splitlines() if line.strip()]


def _append(fh, row: dict) -> None:
    fh.write(json.dumps(row) + "\n")
    fh.flush()  # an interrupted run keeps every finished row


def generate(work: Path, tasks: list[Task], samples: int, max_tokens: int, parallel: int,
             threads: int | None) -> dict[tuple[str, int], dict]:
    """Greedy (seed 0) and sampled (seeds 1..samples) small-tier answers, read from and added to work."""
    from rich.progress import Progress

    from localspec.engine.sampling import SamplingParams
    from localspec.models.manager import ModelManager
    from localspec.service import open_engine

    rows = {(r["id"], r["seed"]): r for r in _read_work(work)}
    todo = {seed: [t for t in tasks if (t.id, seed) not in rows] for seed in range(samples + 1)}
    if not any(todo.values()):
        return rows
    small = ModelManager().profile().small
    engine = open_engine(target=small, mode="off", n_ctx=2048, n_threads=threads, parallel=parallel)
    work.parent.mkdir(parents=True, exist_ok=True)
    try:
        with work.open("a", encoding="utf-8") as fh, Progress() as progress:
            bar = progress.add_task(f"small tier {small}", total=sum(len(v) for v in todo.values()))
            for seed, batch in todo.items():
                sampling = (SamplingParams(temperature=0.0) if seed == 0
                            else SamplingParams(temperature=0.7, top_p=0.95, seed=seed))
                for answer in generate_answers(engine, batch, max_tokens, sampling):
                    task = batch[answer.index]
                    row = {"id": task.id, "seed": seed, "text": answer.text, "passed": check(task, answer.text).passed,
                           "finish": answer.finish_reason, "logprobs": [round(x, 4) for x in answer.token_logprobs]}
                    rows[(task.id, seed)] = row
                    _append(fh, row)
                    progress.advance(bar)
    finally:
        engine.close()
    return rows


def teacher_forced(work: Path, tasks: list[Task], rows: dict[tuple[str, int], dict],
                   threads: int | None) -> dict[str, dict]:
    """The large model's per-token log-probabilities of each greedy small answer, and where its own
    greedy token agrees; read from and added to work. One prefill per task: no generation."""
    from rich.progress import Progress

    from localspec.engine.chat import ChatMessage, render_chat
    from localspec.engine.runtime import ModelRuntime, Row, RuntimeConfig
    from localspec.models.manager import ModelManager

    out = {r["id"]: r for r in _read_work(work)}
    todo = [t for t in tasks if t.id not in out]
    if not todo:
        return out
    manager = ModelManager()
    large = manager.profile().target
    path = manager.require_path(large)
    rt = ModelRuntime(path, RuntimeConfig(n_ctx=1024, n_batch=512, n_ubatch=512, n_outputs_max=320, n_threads=threads))
    end_of_turn = rt.tokenize("<|im_end|>", add_special=False, parse_special=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    try:
        with work.open("a", encoding="utf-8") as fh, Progress() as progress:
            bar = progress.add_task(f"large tier {large} reads the small answers", total=len(todo))
            for task in todo:
                small = rows[(task.id, 0)]
                prompt = rt.tokenize(render_chat(rt.chat_template, [ChatMessage(role="user", content=task.prompt)]),
                                     add_special=False, parse_special=True)
                answer = rt.tokenize(small["text"], add_special=False, parse_special=False)
                answer += end_of_turn if small["finish"] == "stop" else []
                # Row p predicts token p + 1: the rows from the prompt's last token on score the answer.
                seq = prompt + answer
                logits = rt.decode([Row(t, i, 0, logits=i >= len(prompt) - 1 and i < len(seq) - 1)
                                    for i, t in enumerate(seq)]).astype(np.float64)
                rt.seq_rm(0, 0)
                top = logits.max(axis=1)
                lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
                lp = logits[np.arange(len(answer)), answer] - lse
                agree = logits.argmax(axis=1) == np.asarray(answer)
                r = {"id": task.id, "logprobs": [round(float(x), 4) for x in lp], "agree": agree.astype(int).tolist()}
                out[task.id] = r
                _append(fh, r)
                progress.advance(bar)
    finally:
        rt.close()
    return out


def teacher_signals(small: dict, large_view: dict) -> dict[str, float]:
    """Escalation scores from the large model's reading of the small answer: higher, less trusted."""
    lp = np.asarray(large_view["logprobs"] or [0.0])
    own = np.asarray(small["logprobs"] or [0.0])
    return {
        "large_low_mean_logprob": -float(lp.mean()),
        "large_share_disagree": float(1 - np.mean(large_view["agree"] or [1])),
        "large_less_sure_than_small": float(own.mean() - lp.mean()),
    }


def answer_key(task: Task, text: str) -> str:
    """What two answers must share to agree: the final number, or the code up to formatting."""
    if task.kind == "math":
        value = extract_number(text)
        return "none" if value is None else f"{value:.6g}"
    code = extract_code(text)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code.strip()
    for node in ast.walk(tree):  # docstrings say the same thing in other words
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def signals(task: Task, greedy: dict, sampled: list[dict]) -> dict[str, float]:
    """Escalation scores of one task's small answer: higher means less trustworthy."""
    lps = np.asarray(greedy["logprobs"] or [0.0])
    text = greedy["text"]
    if task.kind == "code":
        code = extract_code(text)
        name = SIGNATURE.search(task.prompt)
        invalid = not parses(code) or bool(name) and not any(
            isinstance(n, ast.FunctionDef) and n.name == name.group(1) for n in ast.walk(ast.parse(code)))
    else:
        invalid = extract_number(text) is None
    key = answer_key(task, text)
    disagree = float(np.mean([answer_key(task, s["text"]) != key for s in sampled])) if sampled else 0.0
    return {
        "low_mean_logprob": -float(lps.mean()),
        "low_min_logprob": -float(lps.min()),
        "share_below_p50": float((lps < math.log(0.5)).mean()),
        "cut_off": float(greedy["finish"] == "length"),
        "invalid": float(invalid),
        "disagreement": disagree,
    }


def cross_validated(tasks: list[Task], X: np.ndarray, y: np.ndarray, folds: int = 5, l2: float = 1.0) -> np.ndarray:
    """Held-out logistic scores: each fold scored by a model fitted on the others."""
    pos = {t.id: i for i, t in enumerate(tasks)}
    out = np.zeros(len(tasks))
    for train, held in kfold(tasks, folds):
        ti, hi = [pos[t.id] for t in train], [pos[t.id] for t in held]
        mean, scale = X[ti].mean(axis=0), X[ti].std(axis=0) + 1e-9
        w, b = fit_logistic((X[ti] - mean) / scale, y[ti], l2)
        out[hi] = (X[hi] - mean) / scale @ w + b
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=2, help="sampled answers per task besides the greedy one")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "localspec" / "router" / "cascade-signals.jsonl")
    ap.add_argument("--teacher", action="store_true", help="also score each small answer with the large model")
    ap.add_argument("--teacher-work", type=Path,
                    default=Path.home() / ".cache" / "localspec" / "router" / "cascade-teacher.jsonl")
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    tasks = load_tasks()
    shipped = OutcomeCache(shipped_outcomes())
    large = {t.id: shipped.find(t, "large", args.max_tokens) for t in tasks}
    small_shipped = {t.id: shipped.find(t, "small", args.max_tokens) for t in tasks}
    rows = generate(args.work, tasks, args.samples, args.max_tokens, args.parallel, args.threads)

    sig = [signals(t, rows[(t.id, 0)], [rows[(t.id, k)] for k in range(1, args.samples + 1)]) for t in tasks]
    if args.teacher:
        views = teacher_forced(args.teacher_work, tasks, rows, args.threads)
        for s, t in zip(sig, tasks, strict=True):
            s.update(teacher_signals(rows[(t.id, 0)], views[t.id]))
    names = list(sig[0])
    X = np.asarray([[s[n] for n in names] for s in sig])
    small_ok = np.asarray([float(rows[(t.id, 0)]["passed"]) for t in tasks])
    large_ok = np.asarray([float(large[t.id].passed) for t in tasks])
    gain = (1 - small_ok) * large_ok  # escalating this task turns a failure into a pass

    scores = {n: X[:, i] + 1e-3 * X[:, 0] for i, n in enumerate(names)}  # ties broken by mean logprob
    scores["logistic (all signals, 5-fold CV)"] = cross_validated(tasks, X, gain)
    report: dict = {"tasks": len(tasks), "samples": args.samples, "max_tokens": args.max_tokens,
                    "small_quality": round(float(small_ok.mean()), 4), "large_quality": round(float(large_ok.mean()), 4),
                    "small_verdicts_changed_vs_shipped": int(sum(
                        bool(rows[(t.id, 0)]["passed"]) != small_shipped[t.id].passed for t in tasks)),
                    "routers": {}}
    shipped_ok = np.asarray([float(small_shipped[t.id].passed) for t in tasks])
    shipped_lp = np.asarray([-(small_shipped[t.id].mean_logprob or 0.0) for t in tasks])
    runs = [(n, sc, small_ok) for n, sc in scores.items()]
    runs.append(("low_mean_logprob, shipped small answers (router eval)", shipped_lp, shipped_ok))
    print(f"{'escalate first by':56s} {'APGR [95% CI]':24s} CPT(50%) [95% CI]")
    for name, sc, s_ok in runs:
        r = evaluate_router(name, sc, s_ok, large_ok, args.resamples, 0).as_dict()
        report["routers"][name] = {"apgr": r["apgr"], "cpt50": r["cpt50"]}
        a, c = r["apgr"], r["cpt50"]
        print(f"{name:56s} {a['value']:.3f} [{a['ci95'][0]:.2f}, {a['ci95'][1]:.2f}]     "
              f"{c['value']:.2f} [{c['ci95'][0]:.2f}, {c['ci95'][1]:.2f}]")

    # Why the signals are weak: how often escalating helps, by how sure the small tier was.
    groups = {}
    agree = X[:, names.index("disagreement")]
    for level in sorted(set(agree.tolist())):
        m = agree == level
        groups[f"disagreement {level:.2f}"] = _group(m, small_ok, large_ok, gain)
    lp = X[:, names.index("low_mean_logprob")]
    edges = np.quantile(lp, np.linspace(0, 1, 6))
    for lo, hi in itertools.pairwise(edges):
        groups[f"-mean logprob [{lo:.3f}, {hi:.3f}]"] = _group((lp >= lo) & (lp <= hi), small_ok, large_ok, gain)
    report["groups"] = groups
    # The ceiling of every "the small answer is wrong" signal: escalate exactly the failures first
    # (in random order). Beyond it a router must also predict that the large tier then passes.
    rng = np.random.default_rng(0)
    ceiling = [routing_curve((1 - small_ok) + 1e-3 * rng.random(len(tasks)), small_ok, large_ok).apgr
               for _ in range(200)]
    report["perfect_failure_detector_apgr"] = round(float(np.mean(ceiling)), 4)
    report["auc_small_fails"] = {n: round(_auc(X[:, i], 1 - small_ok), 3) for i, n in enumerate(names)}
    print(f"\nperfect detector of small-tier failures: APGR {report['perfect_failure_detector_apgr']:.3f}")
    print("AUC for 'the small answer fails': " + ", ".join(f"{n} {a:.2f}" for n, a in report["auc_small_fails"].items()))
    print(f"\n{'group':40s} tasks  small  large  escalation helps")
    for name, g in groups.items():
        print(f"{name:40s} {g['tasks']:5d}  {g['small']:.2f}   {g['large']:.2f}   {g['gain']:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"report written to {args.out}")
    return 0


def _auc(score: np.ndarray, positive: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting half."""
    pos, neg = score[positive == 1], score[positive == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    return float(np.mean([(p > neg).mean() + 0.5 * (p == neg).mean() for p in pos]))


def _group(mask: np.ndarray, small_ok: np.ndarray, large_ok: np.ndarray, gain: np.ndarray) -> dict:
    return {"tasks": int(mask.sum()), "small": round(float(small_ok[mask].mean()), 3),
            "large": round(float(large_ok[mask].mean()), 3), "gain": round(float(gain[mask].mean()), 3)}


if __name__ == "__main__":
    raise SystemExit(main())
