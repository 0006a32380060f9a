"""Router policy: features, heuristic and learned decisions, weights JSON, tier start-up validation."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

from localspec.errors import ConfigError, ModelNotFoundError
from localspec.models import load_registry
from localspec.paths import resolve_paths
from localspec.router import (
    FEATURE_NAMES,
    HeuristicPolicy,
    LogisticPolicy,
    RouteDecision,
    RouteInput,
    Router,
    extract_features,
    request_text,
    tiers_from_profile,
    train_policy,
)
from localspec.router.features import feature_vector
from localspec.router.policy import share_threshold

EASY = "What is 15 percent of 80?"
HARD = (
    "A bakery sells muffins for $3 each and cookies for $1.25 each. On Saturday it sold 48 muffins and 3 times "
    "as many cookies as muffins. Then it paid $40 for ingredients, but only if it sold more than 100 items. "
    "What was its profit in dollars?"
)


def default_router(policy=None, cascade=False) -> Router:
    tiers = tiers_from_profile(load_registry().profile("default"))
    return Router(tiers, policy or HeuristicPolicy(), cascade=cascade, profile="default")


def features_of(prompt=None, messages=None, max_tokens=None, hint=None) -> dict[str, float]:
    return extract_features(request_text(messages, prompt), max_tokens, hint)


# ---------------------------------------------------------------- features


def test_features_read_the_whole_conversation():
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Implement a function `parse(s)` in Python."},
        {"role": "assistant", "content": "```python\ndef parse(s):\n    return s\n```"},
        {"role": "user", "content": "Now make it handle 3 cases: 1, 2 and 10, then add tests."},
    ]
    f = features_of(messages=messages, max_tokens=512)
    assert list(f) == list(FEATURE_NAMES)
    assert f["turns"] == 2
    assert f["code_markers"] >= 4  # fences, "function", "python", "def", "return" from earlier turns
    assert f["numbers"] == 4  # the last user message only
    assert f["step_words"] >= 1
    assert f["log_max_tokens"] == pytest.approx(np.log1p(512))
    single = features_of(prompt=messages[-1]["content"])
    assert single["turns"] == 1 and single["log_tokens"] < f["log_tokens"] and single["code_markers"] < f["code_markers"]


def test_math_markers_hints_and_caps():
    f = features_of(prompt=HARD)
    assert f["math_markers"] >= 3 and f["numbers"] >= 5 and f["sentences"] == 4
    assert features_of(prompt="hi", hint="fast")["hint_small"] == 1.0
    assert features_of(prompt="hi", hint="best")["hint_large"] == 1.0
    assert features_of(prompt=" ".join(["7"] * 50))["numbers"] == 10  # capped
    assert features_of(prompt="x")["log_max_tokens"] == 0.0


def test_route_input_from_generation_request():
    from localspec.engine import GenerationRequest

    req = GenerationRequest(messages=[{"role": "user", "content": EASY}], max_tokens=64)
    ri = RouteInput.from_request(req)
    assert ri.prompt is None and ri.messages == [{"role": "user", "content": EASY}] and ri.max_tokens == 64
    assert RouteInput.from_request(GenerationRequest(prompt="x")).prompt == "x"


# ---------------------------------------------------------------- heuristic decisions

LABELLED = [  # (prompt, needs the large tier)
    (EASY, False),
    ("Write a Python function `add(a, b)` that returns a + b.", False),
    ("A box holds 12 pencils. How many pencils are in 7 boxes?", False),
    (HARD, True),
    ("Peter's salary is $3,000 a month. He spends 30% on rent, one fifth of the rest on food, and saves half "
     "of what remains after that. If he also pays $50 for his phone each month before saving, how many dollars "
     "does he save each month?", True),
    ("A bus has 40 seats. At the first stop 23 people get on. At the second stop 9 get off and 17 get on. At the "
     "third stop 6 get off and twice as many get on as got off. How many seats are empty after the third stop?", True),
]


@pytest.mark.parametrize(("prompt", "needs_large"), LABELLED)
def test_heuristic_routes_labelled_examples(prompt, needs_large):
    d = default_router().decide(RouteInput(None, prompt, 256))
    assert isinstance(d, RouteDecision)
    assert d.policy == "heuristic" and d.threshold == 0.5
    assert d.tier == ("large" if needs_large else "small"), d.reason
    assert (d.score >= d.threshold) == needs_large
    assert d.tier in d.reason and d.reason.count("\n") == 0
    out = json.loads(json.dumps(d.as_dict()))
    assert out["tier"] == d.tier and set(out["features"]) == set(FEATURE_NAMES) and out["cascade"] is False


def test_explicit_hints_bypass_the_policy():
    r = default_router()
    assert r.decide(RouteInput(None, HARD, 256, hint="fast")).tier == "small"
    d = r.decide(RouteInput(None, EASY, 256, hint="best"))
    assert d.tier == "large" and d.policy == "explicit"
    assert r.decide(RouteInput(None, HARD, 256, hint="small")).tier == "small"
    assert r.decide(RouteInput(None, EASY, 256, hint="unknown-thing")).policy == "heuristic"


def test_cascade_flag_only_when_routed_to_the_cheap_tier():
    r = default_router(cascade=True)
    easy = r.decide(RouteInput(None, EASY, 256))
    assert easy.tier == "small" and easy.cascade and "escalating to large" in easy.reason
    assert not r.decide(RouteInput(None, HARD, 256)).cascade
    assert not r.decide(RouteInput(None, EASY, 256, hint="fast")).cascade  # explicit: no second guessing


def test_should_escalate_rule():
    r = default_router()
    code_req = RouteInput([{"role": "user", "content": "Write a Python function `f()` that returns 1."}], None, 64)
    assert r.should_escalate(-2.0, "Answer: 4") == (True, "low confidence: mean logprob -2.00 < -0.50")
    assert r.should_escalate(-0.1, "   ")[0]
    assert r.should_escalate(-0.1, "```python\ndef f(:\n    return 1\n```", code_req) == (True, "the code block does not parse")
    keep, why = r.should_escalate(-0.1, "```python\ndef f():\n    return 1\n```", code_req)
    assert not keep and "kept" in why
    assert not r.should_escalate(None, "Answer: 4")[0]


# ---------------------------------------------------------------- learned policy


def _toy_data(n=80, seed=3):
    """Requests whose need for the large tier follows their count of numbers (plus noise)."""
    rng = np.random.default_rng(seed)
    prompts, labels = [], []
    for i in range(n):
        k = int(rng.integers(0, 8))
        nums = " ".join(str(int(rng.integers(1, 99))) for _ in range(k))
        prompts.append(f"Question {chr(65 + i % 26)}: compute with {nums} please.")
        labels.append(1 if k + rng.normal(0, 1) > 4 else 0)
    F = np.asarray([feature_vector(features_of(prompt=p, max_tokens=128)) for p in prompts])
    return prompts, F, np.asarray(labels, dtype=float)


def test_trained_policy_round_trips_through_json_and_routes(tmp_path):
    prompts, F, y = _toy_data()
    policy = train_policy(F, y)
    assert not policy.uses_embedding and policy.meta["n"] == len(y)
    path = tmp_path / "w.json"
    policy.save(path)
    text = path.read_text()
    raw = json.loads(text)  # plain JSON, nothing else
    assert raw["format"] == "localspec-router-weights" and raw["embedding"] is None
    loaded = LogisticPolicy.load(path)
    for p in prompts[:20]:
        f = features_of(prompt=p, max_tokens=128)
        assert loaded.score(f) == pytest.approx(policy.score(f), abs=1e-9)
    # The learned direction: more numbers, more need for the large tier.
    few = features_of(prompt="compute with 3 please.", max_tokens=128)
    many = features_of(prompt="compute with 3 14 15 92 65 35 89 please.", max_tokens=128)
    assert loaded.score(many) > loaded.score(few)
    loaded.set_share(0.4)
    r = default_router(policy=loaded)
    assert r.decide(RouteInput(None, "compute with 3 14 15 92 65 35 89 please.", 128)).tier == "large"
    d = r.decide(RouteInput(None, "compute with 3 please.", 128))
    assert d.tier == "small" and d.policy == "learned"
    # The threshold sends ~40% of the training requests up.
    share = np.mean([loaded.score(features_of(prompt=p, max_tokens=128)) >= loaded.threshold for p in prompts])
    assert 0.3 <= share <= 0.5


def test_trained_policy_with_embedding_block(tmp_path):
    _, F, y = _toy_data(60)
    E = np.random.default_rng(0).normal(size=(len(y), 16))
    E[:, 0] += 3 * y  # one embedding direction carries the label
    policy = train_policy(F, y, E, embedding_model="toy", alpha_grid=(1.0,))
    assert policy.uses_embedding and policy.embedding_dim == 16
    policy.save(tmp_path / "w.json")
    loaded = LogisticPolicy.load(tmp_path / "w.json")
    f = dict(zip(FEATURE_NAMES, F[0], strict=True))
    assert loaded.score(f, E[0]) == pytest.approx(policy.score(f, E[0]))
    assert 0.0 < loaded.score(f, None) < 1.0  # a missing vector scores as the training mean


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda raw: "not json {", "not valid JSON"),
    (lambda raw: {**raw, "format": "pickle"}, "not a localspec-router-weights file"),
    (lambda raw: {**raw, "version": 99}, "version 99"),
    (lambda raw: {**raw, "coef": raw["coef"][:-1]}, "coef must be a list of"),
    (lambda raw: {**raw, "scale": [0.0] * len(raw["scale"])}, "scale holds non-positive"),
    (lambda raw: {**raw, "intercept": "x"}, "intercept must be a finite number"),
    (lambda raw: {**raw, "feature_names": ["a"]}, "feature_names differ"),
])
def test_malformed_weights_are_rejected_with_a_clear_error(tmp_path, mutate, message):
    _, F, y = _toy_data(40)
    raw = train_policy(F, y).to_json()
    path = tmp_path / "bad.json"
    bad = mutate(raw)
    path.write_text(bad if isinstance(bad, str) else json.dumps(bad))
    with pytest.raises(ConfigError) as err:
        LogisticPolicy.load(path)
    assert message in err.value.cause and str(path) in err.value.cause
    assert "router train" in err.value.fix


def test_share_threshold_quantiles():
    scores = np.linspace(0, 1, 101)
    assert np.mean(scores >= share_threshold(scores, 0.4)) == pytest.approx(0.4, abs=0.011)
    assert np.mean(scores >= share_threshold(scores, 0.0)) == 0.0
    assert np.mean(scores >= share_threshold(scores, 1.0)) == 1.0


def test_training_needs_both_labels():
    _, F, _ = _toy_data(20)
    with pytest.raises(ValueError, match="both classes"):
        train_policy(F, np.zeros(len(F)))


# ---------------------------------------------------------------- profile tiers and start-up validation


def _overlay(body: str) -> None:
    cfg = resolve_paths().config_dir
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "models.toml").write_text(textwrap.dedent(body))


def test_profile_tiers_are_ordered_by_cost():
    _overlay("""
        [profiles.withremote]
        target = "qwen2.5-coder-1.5b-instruct-q4_k_m"
        draft = "qwen2.5-coder-0.5b-instruct-q4_k_m"
        small = "qwen2.5-coder-0.5b-instruct-q4_k_m"
        cascade = true
        large_share = 0.25
        [profiles.withremote.remote]
        base_url = "http://127.0.0.1:9/v1"
        model = "big"
    """)
    prof = load_registry().profile("withremote")
    assert prof.cascade and prof.large_share == 0.25
    tiers = tiers_from_profile(prof)
    assert [t.name for t in tiers] == ["small", "large", "remote"]
    assert tiers[1].draft == "qwen2.5-coder-0.5b-instruct-q4_k_m" and tiers[2].kind == "remote"
    r = Router(tiers, HeuristicPolicy(), cascade=prof.cascade)
    assert r.decide(RouteInput(None, HARD, 256)).tier == "remote"
    assert r.best_local().name == "large"


@pytest.mark.parametrize(("remote", "message"), [
    ('base_url = "127.0.0.1:8001"\nmodel = "m"', "is not an http(s) URL"),
    ('base_url = "http://:80/v1"\nmodel = "m"', "is not an http(s) URL"),
    ('base_url = "http://host:99999/v1"\nmodel = "m"', "invalid port"),
    ('base_url = "http://127.0.0.1:8001/v1"\nmodel = "m"\napi_key_env = "LOCALSPEC_TEST_UNSET_KEY"',
     "LOCALSPEC_TEST_UNSET_KEY"),
])
def test_bad_remote_tier_fails_at_start_up(remote, message, monkeypatch):
    monkeypatch.delenv("LOCALSPEC_TEST_UNSET_KEY", raising=False)
    _overlay(f"""
[profiles.bad]
target = "qwen2.5-coder-1.5b-instruct-q4_k_m"
[profiles.bad.remote]
{remote}
""")
    with pytest.raises(ConfigError) as err:
        Router.from_profile("bad", check_installed=False)
    assert message in err.value.cause and "profiles.bad.remote" in err.value.cause
    assert err.value.fix


def test_tier_model_not_installed_names_the_pull_command():
    _overlay("""
        [profiles.missing]
        target = "qwen2.5-coder-32b-instruct-q4_k_m"
        small = "qwen2.5-coder-0.5b-instruct-q4_k_m"
    """)
    with pytest.raises(ModelNotFoundError) as err:
        Router.from_profile("missing")
    assert "localspec models pull qwen2.5-coder-32b-instruct-q4_k_m" in err.value.fix


def test_from_profile_loads_trained_weights(tmp_path, target_path, draft_path):
    _, F, y = _toy_data(40)
    policy = train_policy(F, y)
    policy.save(tmp_path / "w.json")
    r = Router.from_profile("default", weights=tmp_path / "w.json")
    assert r.policy.name == "learned" and r.embedder is None  # features only: no embedder loaded
    assert r.policy.threshold == pytest.approx(share_threshold(policy.train_scores, 0.4))
    assert Router.from_profile("default").policy.name == "heuristic"  # no weights in this home


# ---------------------------------------------------------------- CLI


def test_cli_train_then_show_uses_the_weights(tmp_path, capsys, target_path, draft_path):
    from localspec.cli import main
    from localspec.router import weights_path
    from localspec.router.evaluation import Labelled, write_labels

    prompts, _, y = _toy_data(40)
    labels = tmp_path / "labels.jsonl"
    write_labels(labels, [Labelled(None, p, 128, int(v)) for p, v in zip(prompts, y, strict=True)])
    assert main(["router", "train", str(labels), "--no-embedding"]) == 0
    out = capsys.readouterr().out
    assert "features only" in out and str(weights_path("default")) in out
    assert weights_path("default").is_file()
    assert main(["router", "show", "compute with 3 14 15 92 65 35 89 please.", "--max-tokens", "128"]) == 0
    out = capsys.readouterr().out
    assert "policy learned" in out and "-> large" in out and '"policy": "learned"' in out
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x", "label": 2}\n')
    assert main(["router", "train", str(bad), "--no-embedding"]) == 1
    assert "label must be 0 or 1" in capsys.readouterr().err
