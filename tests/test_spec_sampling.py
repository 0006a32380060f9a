"""Statistical tests: speculative sampling must have exactly the target's output distribution.

Three layers:

1. `verify()` alone, on synthetic p/q pairs: the token it emits at a position is distributed as p
   (and, after a rejection, as the normalised residual), and a loop of verify calls over
   position-dependent rows emits the right joint distribution for k = 2 and 3.
2. The whole `Engine` (draft, batched verify, KV rollback, bonus token) over `FakeRuntime`
   models whose logits are a known function of the history: the joint distribution of the
   generated tokens is compared with the exact one computed by walking the tree of histories.
3. Seeds reproduce runs, and greedy speculative decoding returns exactly the greedy tokens.

Every statistical test is a chi-square goodness-of-fit test with cells of expected count < 5
merged. Seeds are fixed, so the outcome is deterministic; the significance level is Bonferroni
corrected over all statistical tests in this file (overall alpha = 1e-3). The `test_power_*`
tests run the same harnesses, at the same sample sizes, against deliberately wrong samplers
and assert that the harness rejects them, so a real bug of those kinds cannot pass unnoticed.
The statistical tests are marked `slow` (two minutes here, and their sample sizes are their
power, so they are not cut): they run in stage 2 (`-m models`); part 3 runs in the fast suite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest
from scipy.stats import chisquare

from tests.fake_runtime import FakeRuntime, logits_fn
from localspec.engine import scheduler as scheduler_module
from localspec.engine.config import EngineConfig, GenerationRequest
from localspec.engine.events import Done, Token
from localspec.engine.sampling import SamplingParams, distribution
from localspec.engine.scheduler import Engine
from localspec.engine.verify import RESIDUAL_EPS, Draft, PositionRng, Verdict, verify, verify_greedy


# Chi-square tests that must accept the engine (each parametrised case counts once):
#   verify marginal: 5 dirichlet + disjoint + equal + 2 near-empty residual + one-token residual
#                    + q on p's zeros (11) + 3 point-mass                                   = 14
#   verify conditional residual: 3;  verify loop k=2/3 (sampled q) + k=3 point mass       =  3
#   engine: draft k=3, draft k=2, lookup, top-k/top-p, penalties, prediction,
#           parallel (2 requests)                                                          =  8
N_STAT_TESTS = 14 + 3 + 3 + 8
ALPHA = 1e-3 / N_STAT_TESTS

VerifyFn = Callable[[Sequence[np.ndarray], Draft, PositionRng, int], Verdict]


# ---------------------------------------------------------------------------------------- helpers


def chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Goodness of fit of `counts` to `probs`; cells with expected count < 5 are pooled.

    A count in a cell of probability 0 is an impossible outcome: p-value 0.
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    assert counts.shape == probs.shape
    assert abs(probs.sum() - 1.0) < 1e-9, probs.sum()
    assert (probs >= 0).all()
    if counts[probs <= 0].sum() > 0:
        return 0.0
    n = counts.sum()
    keep = probs > 0
    obs, exp = counts[keep], n * probs[keep]
    order = np.argsort(exp, kind="stable")
    obs, exp = obs[order], exp[order]
    n_small = int((exp < 5).sum())
    if n_small:
        pool_o, pool_e = obs[:n_small].sum(), exp[:n_small].sum()
        obs, exp = obs[n_small:], exp[n_small:]
        while pool_e < 5 and exp.size:
            pool_o, pool_e = pool_o + obs[0], pool_e + exp[0]
            obs, exp = obs[1:], exp[1:]
        obs, exp = np.append(obs, pool_o), np.append(exp, pool_e)
    if exp.size < 2:
        return 1.0
    exp *= n / exp.sum()
    return float(chisquare(obs, exp).pvalue)


def assert_fits(counts: np.ndarray, probs: np.ndarray, what: str) -> None:
    pv = chi2_pvalue(counts, probs)
    n = int(np.sum(counts))
    assert pv > ALPHA, (
        f"{what}: the output is not distributed as the target (chi-square p = {pv:.3g} < {ALPHA:.2g}, "
        f"n = {n})\nobserved freq {np.round(np.ravel(counts) / max(n, 1), 4).tolist()[:40]}\n"
        f"expected freq {np.round(np.ravel(probs), 4).tolist()[:40]}"
    )


def normalise(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x / x.sum()


# --------------------------------------------------------------- deliberately wrong samplers


def make_wrong_verify(bug: str) -> VerifyFn:
    """A copy of the rejection rule with one classic mistake, to prove the harnesses catch it."""

    def wrong(p, draft, rng, start_pos):
        for i, d in enumerate(draft.tokens):
            pos = start_pos + i
            q_d = 1.0 if draft.q is None or bug == "ignore_q" else float(draft.q[i][d])
            if rng.uniform(pos) * q_d < p[i][d]:
                continue
            if bug in ("residual_from_p", "ignore_q"):
                residual = p[i].copy()
            elif draft.q is None:
                residual = p[i].copy()
                if bug != "point_mass_keeps_d":
                    residual[d] = 0.0
            else:
                residual = np.maximum(p[i] - draft.q[i], 0.0)
            if residual.sum() < RESIDUAL_EPS:
                residual = p[i]
            return Verdict(accepted=i, next_token=rng.choice(residual, pos))
        k = len(draft.tokens)
        row = k - 1 if bug == "bonus_wrong_row" and k > 0 else k
        return Verdict(accepted=k, next_token=rng.choice(p[row], start_pos + k))

    return wrong


# ======================================================================= 1. verify() as a function

V = 6  # vocabulary of the synthetic cases
N_MARGINAL = 8000


def _dirichlet_pair(seed: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    return g.dirichlet(np.full(V, alpha)), g.dirichlet(np.full(V, alpha))


def _cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    cases = {}
    for s, alpha in [(1, 1.0), (2, 1.0), (3, 0.5), (4, 2.0), (5, 0.3)]:
        cases[f"dirichlet{s}"] = _dirichlet_pair(100 + s, alpha)
    cases["disjoint"] = (normalise([3, 2, 1, 0, 0, 0]), normalise([0, 0, 0, 1, 1, 2]))
    p = normalise([5, 1, 3, 2, 4, 0.5])
    cases["equal"] = (p, p.copy())
    # q differs from p by rounding noise: residual mass far below RESIDUAL_EPS (the fallback path).
    cases["residual_below_eps"] = (p, normalise(p * (1 + 1e-13 * np.arange(V))))
    # q close to p but not equal: residual mass ~ 1e-3, spread over several tokens.
    cases["residual_small"] = (p, normalise(p * (1 + 2e-3 * np.array([1, -1, 1, -1, 1, -1]))))
    # q exceeds p on every token but one: the residual is a point mass on token 2.
    q = p + 0.01
    q[2] = p[2] - 0.05
    cases["residual_one_token"] = (p, q)
    # p has zeros; q puts some mass there (and less everywhere p > 0).
    pz = normalise([4, 0, 3, 0, 2, 1])
    cases["q_covers_p_zeros"] = (pz, normalise(0.8 * pz + 0.2 * normalise([0, 3, 0, 1, 0, 0])))
    return cases


CASES = _cases()


def draw_position0(p: np.ndarray, q: np.ndarray | None, n: int, seed: int, verify_fn: VerifyFn = verify,
                   point: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """n independent trials of one-token speculation; returns (token at position 0, accepted?)."""
    p_next = normalise(np.arange(1, V + 1))  # the bonus row: must never leak into position 0
    if q is None:
        ds = np.full(n, point)
    else:
        ds = np.random.default_rng(seed).choice(V, size=n, p=q)
    toks = np.empty(n, dtype=np.int64)
    acc = np.empty(n, dtype=bool)
    for i, d in enumerate(ds):
        draft = Draft((int(d),), None if q is None else (q,))
        v = verify_fn([p, p_next], draft, PositionRng(seed * 1_000_003 + i), 0)
        acc[i] = v.accepted == 1
        toks[i] = d if acc[i] else v.next_token
    return toks, acc


@pytest.mark.slow  # chi-square at full power: stage 2
@pytest.mark.parametrize("case", list(CASES))
def test_verify_marginal_is_p(case):
    p, q = CASES[case]
    toks, acc = draw_position0(p, q, N_MARGINAL, seed=7 + list(CASES).index(case))
    assert_fits(np.bincount(toks, minlength=V), p, f"verify, case {case}")
    # The acceptance rate is sum(min(p, q)); a loose check that the rule itself is min(1, p/q).
    expect = np.minimum(p, q).sum()
    sd = np.sqrt(expect * (1 - expect) / N_MARGINAL) + 1e-12
    assert abs(acc.mean() - expect) < 5 * sd + 1e-9, (acc.mean(), expect)


@pytest.mark.slow  # chi-square at full power: stage 2
@pytest.mark.parametrize("point", ["argmax", "p_zero", "mid"])
def test_verify_point_mass_marginal_is_p(point):
    """q = None: the drafter proposes d deterministically; accept with p(d), else p without d."""
    p = normalise([0.0, 4, 1, 2, 3, 0.5])
    d = {"argmax": 1, "p_zero": 0, "mid": 3}[point]
    toks, acc = draw_position0(p, None, N_MARGINAL, seed=50 + d, point=d)
    assert_fits(np.bincount(toks, minlength=V), p, f"verify, point-mass draft {d}")
    assert abs(acc.mean() - p[d]) < 5 * np.sqrt(p[d] * (1 - p[d]) / N_MARGINAL) + 1e-9


@pytest.mark.slow  # chi-square at full power: stage 2
@pytest.mark.parametrize("case", ["dirichlet1", "dirichlet3", "q_covers_p_zeros"])
def test_verify_replacement_is_residual(case):
    """Given a rejection, the replacement is distributed as norm(max(0, p - q))."""
    p, q = CASES[case]
    toks, acc = draw_position0(p, q, N_MARGINAL, seed=300 + list(CASES).index(case))
    rejected = toks[~acc]
    assert rejected.size > 500
    assert_fits(np.bincount(rejected, minlength=V), normalise(np.maximum(p - q, 0)), f"residual, {case}")


# ---- k = 2 / 3: a loop of verify calls over rows fixed per absolute position

VL = 4  # vocabulary of the loop test: (k + 1) positions -> VL ** (k + 1) joint cells
N_LOOP = 8000


def _loop_rows() -> tuple[list[np.ndarray], list[np.ndarray]]:
    g = np.random.default_rng(2024)
    P = [g.dirichlet(np.ones(VL)) for _ in range(8)]
    Q = [normalise(0.5 * P[j] + 0.5 * g.dirichlet(np.ones(VL))) for j in range(8)]
    return P, Q


def loop_joint(k: int, n: int, seed: int, point_mass: bool, verify_fn: VerifyFn = verify) -> np.ndarray:
    """Emit the first k + 1 tokens the way the engine does: draft min(k, left - 1), verify, repeat.

    The target row at absolute position j is P[j] whatever the history, so the exact joint of
    the emitted tokens is the product of the P[j]. Point-mass drafts propose (last + 1) % VL.
    Returns counts over the VL ** (k + 1) joint cells.
    """
    P, Q = _loop_rows()
    L = k + 1
    g = np.random.default_rng(seed)
    counts = np.zeros(VL**L, dtype=np.int64)
    for trial in range(n):
        rng = PositionRng(seed * 1_000_003 + trial)
        out: list[int] = []
        while len(out) < L:
            start = len(out)
            kk = min(k, L - start - 1)
            if point_mass:
                toks, last = [], (out[-1] if out else 0)
                for _ in range(kk):
                    last = (last + 1) % VL
                    toks.append(last)
                draft = Draft(tuple(toks))
            else:
                toks = tuple(int(g.choice(VL, p=Q[start + j])) for j in range(kk))
                draft = Draft(toks, tuple(Q[start + j] for j in range(kk)))
            v = verify_fn([P[start + j] for j in range(kk + 1)], draft, rng, start)
            out.extend(draft.tokens[: v.accepted])
            out.append(v.next_token)
        counts[int(np.ravel_multi_index(tuple(out[:L]), (VL,) * L))] += 1
    return counts


def loop_expected(k: int) -> np.ndarray:
    P, _ = _loop_rows()
    joint = P[0]
    for j in range(1, k + 1):
        joint = np.multiply.outer(joint, P[j])
    return joint.ravel()


@pytest.mark.slow  # chi-square at full power: stage 2
@pytest.mark.parametrize("k,point_mass", [(2, False), (3, False), (3, True)])
def test_verify_loop_joint(k, point_mass):
    counts = loop_joint(k, N_LOOP, seed=900 + 10 * k + point_mass, point_mass=point_mass)
    assert_fits(counts, loop_expected(k), f"verify loop, k={k}, point mass={point_mass}")


# ---- power of the verify harnesses

@pytest.mark.parametrize(
    "bug,harness",
    [
        ("residual_from_p", "marginal"),
        ("ignore_q", "marginal"),
        ("point_mass_keeps_d", "point_mass"),
        ("residual_from_p", "residual"),
        ("bonus_wrong_row", "loop"),
        ("residual_from_p", "loop"),
    ],
)
@pytest.mark.slow  # chi-square at full power: stage 2
def test_power_verify_harness_rejects_wrong_sampler(bug, harness):
    wrong = make_wrong_verify(bug)
    if harness == "marginal":
        p, q = CASES["dirichlet1"]
        toks, _ = draw_position0(p, q, N_MARGINAL, seed=7, verify_fn=wrong)
        pv = chi2_pvalue(np.bincount(toks, minlength=V), p)
    elif harness == "point_mass":
        p = normalise([0.0, 4, 1, 2, 3, 0.5])
        toks, _ = draw_position0(p, None, N_MARGINAL, seed=53, point=3, verify_fn=wrong)
        pv = chi2_pvalue(np.bincount(toks, minlength=V), p)
    elif harness == "residual":
        p, q = CASES["dirichlet1"]
        toks, acc = draw_position0(p, q, N_MARGINAL, seed=300, verify_fn=wrong)
        pv = chi2_pvalue(np.bincount(toks[~acc], minlength=V), normalise(np.maximum(p - q, 0)))
    else:
        pv = chi2_pvalue(loop_joint(2, N_LOOP, seed=920, point_mass=False, verify_fn=wrong), loop_expected(2))
    assert pv < ALPHA * 1e-3, f"the {harness} harness does not catch bug {bug!r} (p = {pv:.3g})"


# ============================================================ 2. the engine over fake models

NV = 4  # ordinary tokens of the fake models (+ 1 EOS the logits never pick)
TARGET = logits_fn(NV, salts=(11,), scales=(1.2,), step_bonus=1.0)
DRAFT = logits_fn(NV, salts=(11, 12), scales=(1.2, 0.9), step_bonus=1.0)
PROMPT = "0 1 2 3 0 1 2"  # repeats, so prompt lookup proposes
PROMPT_B = "3 1 1 0"
N_ENGINE = 9000
N_PARALLEL = 6000


def make_engine(parallel: int = 1, **cfg) -> Engine:
    cfg.setdefault("draft_p_min", 0.0)
    return Engine(
        FakeRuntime(TARGET, NV, n_seq_max=parallel),
        FakeRuntime(DRAFT, NV, n_seq_max=parallel),
        EngineConfig(parallel=parallel, **cfg),
    )


def assert_kv_consistent(engine: Engine) -> None:
    """The engine's record of each KV cache is what the (fake) caches really hold."""
    for slot in engine.slots:
        assert engine.target.history(slot.seq) == slot.kv, f"target KV of seq {slot.seq} out of sync"
        if engine.drafter is not None and slot.seq in engine.drafter.kv:
            assert engine.draft.history(slot.seq) == engine.drafter.kv[slot.seq], f"draft KV of seq {slot.seq}"


def exact_joint(prompt: str, params: SamplingParams, length: int) -> np.ndarray:
    """P(next `length` tokens = path) under the target alone, over NV ** length paths."""
    history = [int(t) for t in prompt.split()]
    joint = np.zeros((NV,) * length)

    def walk(h: list[int], prefix: tuple[int, ...], prob: float) -> None:
        if len(prefix) == length:
            joint[prefix] = prob
            return
        p = distribution(TARGET(tuple(h)), params, h)
        assert p[NV] == 0.0  # EOS is impossible
        for t in range(NV):
            if p[t] > 0:
                walk(h + [t], prefix + (t,), prob * p[t])

    walk(history, (), 1.0)
    return joint.ravel()


def tokens_of(events) -> tuple[list[int], Done]:
    ids: list[int] = []
    done = None
    for ev in events:
        if isinstance(ev, Token):
            ids.extend(ev.ids)
        elif isinstance(ev, Done):
            done = ev
    assert done is not None
    return ids, done


def sample_engine(engine: Engine, prompt: str, params: Callable[[int], SamplingParams], mode: str, k: int,
                  max_tokens: int, n: int, seed0: int,
                  prediction: str | None = None) -> tuple[np.ndarray, float, float]:
    """Run n requests (seeds seed0..), count the joint of their tokens; also acceptance stats."""
    counts = np.zeros(NV**max_tokens, dtype=np.int64)
    drafted = accepted = 0
    for s in range(seed0, seed0 + n):
        req = GenerationRequest(prompt=prompt, max_tokens=max_tokens, sampling=params(s), mode=mode, k=k,
                                prediction=prediction)
        ids, done = tokens_of(engine.generate(req))
        assert done.error is None, done.error
        assert len(ids) == max_tokens and done.finish_reason == "length", (ids, done.finish_reason)
        counts[int(np.ravel_multi_index(tuple(ids), (NV,) * max_tokens))] += 1
        drafted += done.stats.drafted
        accepted += done.stats.accepted
    assert_kv_consistent(engine)
    return counts, drafted / n, accepted / max(drafted, 1)


def sampled(**kw) -> Callable[[int], SamplingParams]:
    kw = {"temperature": 1.0, **kw}
    return lambda s: SamplingParams(seed=s, **kw)


ENGINE_CASES = {
    # name: (mode, k, max_tokens, sampling kwargs, seed0)
    "draft_k3": ("draft", 3, 4, {}, 10_000),
    "draft_k2": ("draft", 2, 3, {}, 20_000),
    "lookup": ("lookup", 3, 4, {}, 30_000),
    "top_k_top_p": ("draft", 3, 4, dict(temperature=0.8, top_k=3, top_p=0.9), 40_000),
    "penalties": ("draft", 3, 4, dict(frequency_penalty=0.8, presence_penalty=0.6, repeat_penalty=1.5), 50_000),
    # Predicted Outputs alone: lookup with k 0 drafts nothing itself, the prediction drafts up to 16.
    "prediction": ("lookup", 0, 4, {}, 60_000),
}
# Cases whose requests carry a prediction (Predicted Outputs): a point-mass draft, verified by the same rule.
PREDICTIONS = {"prediction": "3 0 1 2"}


def run_engine_case(name: str, n: int = N_ENGINE) -> tuple[np.ndarray, np.ndarray, float, float]:
    mode, k, max_tokens, kw, seed0 = ENGINE_CASES[name]
    params = sampled(**kw)
    counts, drafted, acc = sample_engine(make_engine(), PROMPT, params, mode, k, max_tokens, n, seed0,
                                         prediction=PREDICTIONS.get(name))
    return counts, exact_joint(PROMPT, params(0), max_tokens), drafted, acc


@pytest.mark.slow  # chi-square at full power: stage 2
@pytest.mark.parametrize("name", list(ENGINE_CASES))
def test_engine_output_is_target_distribution(name):
    counts, expected, drafted, acc = run_engine_case(name)
    # The case must really speculate, with partial acceptance.
    assert drafted > 0.5, f"too few drafted tokens per request: {drafted}"
    assert 0.05 < acc < 0.95, f"acceptance rate {acc} makes the test weak"
    assert_fits(counts, expected, f"engine, {name}")


@pytest.mark.slow  # chi-square at full power: stage 2
def test_engine_parallel_interleaved_requests_are_exact():
    """Two slots, one drafting and one in lookup mode, prefills interleaved with decode steps."""
    engine = make_engine(parallel=2, prefill_budget=3)
    length = 4
    params = sampled()
    counts = {"a": np.zeros(NV**length, dtype=np.int64), "b": np.zeros(NV**length, dtype=np.int64)}
    max_seqs = 0
    for s in range(N_PARALLEL):
        ha = engine.submit(GenerationRequest(prompt=PROMPT, max_tokens=length, sampling=params(60_000 + s),
                                             mode="draft", k=3))
        if s % 2:
            engine.step()  # stagger: b joins while a is prefilling
        hb = engine.submit(GenerationRequest(prompt=PROMPT_B, max_tokens=length, sampling=params(70_000 + s),
                                             mode="lookup", k=2))
        while not (ha.done.is_set() and hb.done.is_set()):
            engine.step()
            max_seqs = max(max_seqs, engine.last_step_sequences)
        for key, h in (("a", ha), ("b", hb)):
            ids = _drain(h)
            assert h.result.error is None, h.result.error
            assert len(ids) == length, ids
            counts[key][int(np.ravel_multi_index(tuple(ids), (NV,) * length))] += 1
    assert max_seqs == 2, "the two requests never shared a step"
    assert_kv_consistent(engine)
    assert_fits(counts["a"], exact_joint(PROMPT, params(0), length), "engine parallel, request a (draft)")
    assert_fits(counts["b"], exact_joint(PROMPT_B, params(0), length), "engine parallel, request b (lookup)")


@pytest.mark.slow  # chi-square at full power: stage 2
@pytest.mark.parametrize("bug", ["residual_from_p", "bonus_wrong_row"])
def test_power_engine_harness_rejects_wrong_verify(bug, monkeypatch):
    """Even a third of the samples of the draft_k3 case exposes these bugs (p ~ 1e-96 and 0)."""
    monkeypatch.setattr(scheduler_module, "verify", make_wrong_verify(bug))
    counts, expected, _, _ = run_engine_case("draft_k3", n=N_ENGINE // 3)
    pv = chi2_pvalue(counts, expected)
    assert pv < ALPHA * 1e-3, f"the engine harness does not catch bug {bug!r} (p = {pv:.3g})"


def test_verify_greedy_is_verify_on_point_masses():
    """The greedy shortcut gives verify()'s verdict on one-hot rows, with and without a q, whatever the draws."""
    rng = np.random.default_rng(7)
    nv, seen = 6, set()
    for trial in range(400):
        k = int(rng.integers(0, 5))
        targets = [int(t) for t in rng.integers(0, 3, size=k + 1)]  # small range: drafts often match
        tokens = tuple(int(t) for t in rng.integers(0, 3, size=k))
        q = None if trial % 2 else tuple(rng.dirichlet(np.ones(nv)) for _ in range(k))
        rows = [np.eye(nv)[t] for t in targets]
        expected = verify(rows, Draft(tokens, q=q), PositionRng(trial), start_pos=int(rng.integers(0, 50)))
        assert verify_greedy(targets, Draft(tokens, q=q)) == expected, (targets, tokens)
        seen.add(expected.accepted == k)
    assert seen == {True, False}  # both full acceptance and a rejection were exercised


# ======================================================================= 3. reproducibility


def _run_done(engine: Engine, prompt: str, params: SamplingParams, mode: str, k: int | None,
              n: int) -> tuple[list[int], Done]:
    ids, done = tokens_of(engine.generate(GenerationRequest(prompt=prompt, max_tokens=n, sampling=params,
                                                            mode=mode, k=k)))
    assert done.error is None, done.error
    assert_kv_consistent(engine)
    return ids, done


def _run(engine: Engine, prompt: str, params: SamplingParams, mode: str, k: int | None, n: int) -> list[int]:
    return _run_done(engine, prompt, params, mode, k, n)[0]


@pytest.mark.parametrize("mode,k", [("draft", 3), ("draft", 5), ("lookup", 4), ("off", None)])
def test_same_seed_same_tokens(mode, k):
    params = SamplingParams(temperature=1.0, top_p=0.95, frequency_penalty=0.3, seed=1234)
    first = _run(make_engine(), PROMPT, params, mode, k, 40)
    engine = make_engine()
    _run(engine, PROMPT_B, params.model_copy(update={"seed": 99}), mode, k, 17)  # leaves KV state behind
    again = _run(engine, PROMPT, params, mode, k, 40)
    assert len(first) == 40
    assert again == first
    other = _run(engine, PROMPT, params.model_copy(update={"seed": 1235}), mode, k, 40)
    assert other != first


def test_same_seed_same_tokens_when_interleaved():
    """PositionRng keys draws by position, so sharing steps with another request changes nothing."""
    params = SamplingParams(temperature=1.0, seed=77)
    alone = _run(make_engine(), PROMPT, params, "draft", 3, 30)
    engine = make_engine(parallel=2, prefill_budget=2)
    hb = engine.submit(GenerationRequest(prompt=PROMPT_B + " " + PROMPT, max_tokens=25,
                                         sampling=params.model_copy(update={"seed": 5}), mode="lookup", k=3))
    engine.step()
    ha = engine.submit(GenerationRequest(prompt=PROMPT, max_tokens=30, sampling=params, mode="draft", k=3))
    while not (ha.done.is_set() and hb.done.is_set()):
        engine.step()
    ids = _drain(ha)
    assert engine.max_step_sequences == 2
    assert ids == alone


def test_a_prompts_last_token_is_read_alone_fresh_or_reused():
    """A row's logits depend (in their last bits) on the batch it is computed in. A reused prompt
    re-reads only its last token, so a fresh prefill reads that token alone too: both ways, the
    first token comes from the same one-row pass."""
    engine = make_engine(prefill_budget=64)
    passes: list[list[tuple[int, bool]]] = []
    decode = engine.target.decode
    engine.target.decode = lambda rows: passes.append([(r.pos, r.logits) for r in rows]) or decode(rows)
    n = len(PROMPT.split())
    for _ in range(2):
        passes.clear()
        _run(engine, PROMPT, SamplingParams(), "off", None, 1)
        assert passes[-1] == [(n - 1, True)], passes
    assert passes == [[(n - 1, True)]], "the second request re-read more than the last token"
    engine.target.seq_rm(0, 0, -1)
    engine.slots[0].kv.clear()
    passes.clear()
    _run(engine, PROMPT, SamplingParams(), "off", None, 1)
    assert passes == [[(i, False) for i in range(n - 1)], [(n - 1, True)]]


def _drain(handle) -> list[int]:
    ids: list[int] = []
    while not handle.events.empty():
        ev = handle.events.get_nowait()
        if isinstance(ev, Token):
            ids.extend(ev.ids)
    return ids


@pytest.mark.parametrize("penalties", [False, True])
def test_greedy_speculation_equals_greedy_off(penalties):
    params = SamplingParams(repeat_penalty=1.3, frequency_penalty=0.4) if penalties else SamplingParams()
    engine = make_engine()
    strict = make_engine(draft_p_min=0.5)
    drafted = {"draft": 0, "lookup": 0}
    accepted = dict(drafted)
    for prompt in (PROMPT, PROMPT_B, "2", "1 1 1 1 3"):
        ref = _run(engine, prompt, params, "off", None, 40)
        assert len(ref) == 40
        for eng, mode, k in ((engine, "draft", 4), (strict, "draft", 6), (engine, "lookup", 5)):
            ids, done = _run_done(eng, prompt, params, mode, k, 40)
            assert ids == ref, (prompt, mode, k)
            drafted[mode] += done.stats.drafted
            accepted[mode] += done.stats.accepted
    # Both drafters really proposed, and were both accepted and rejected along the way.
    for mode in drafted:
        assert 0 < accepted[mode] < drafted[mode], (mode, accepted[mode], drafted[mode])


def test_fake_runtime_catches_kv_mistakes():
    """The fake raises on the bookkeeping errors the engine tests rely on it to expose."""
    from localspec.engine.runtime import Row

    rt = FakeRuntime(TARGET, NV)
    out = rt.decode([Row(0, 0, 0), Row(1, 1, 0, logits=True)])
    assert np.array_equal(out[0], TARGET((0, 1)))
    with pytest.raises(AssertionError):
        rt.decode([Row(2, 1, 0)])  # position 1 is already held
    with pytest.raises(AssertionError):
        rt.decode([Row(2, 3, 0)])  # position 2 is missing
    rt.seq_rm(0, 1, -1)
    assert rt.history(0) == [0]
    out = rt.decode([Row(3, 1, 0, logits=True)])
    assert np.array_equal(out[0], TARGET((0, 3)))
