"""The command line's conventions: exit statuses, one name per option (old spellings still work,
with a note), tables that never cut an id, profiles, `doctor` on a healthy install, a closed pipe,
and shell completion."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from rich.table import Table

from tests.common import DRAFT_ID, REPO, SHARED_STORE, TARGET_ID
from localspec.cli import build_parser, main
from localspec.cli.options import CACHE_JUDGES, MODES
from localspec.cli.output import stacked
from localspec.cli.parsing import leaf_commands, subcommands

PARSER = build_parser()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), **extra}


# ---------------------------------------------------------------- exit statuses


def test_a_runtime_failure_is_1_and_a_usage_error_is_2(capsys):
    assert main(["models", "rm", "no-such-model"]) == 1
    assert main(["profiles", "no-such-profile"]) == 1
    assert main(["stats", "--since", "last tuesday"]) == 2  # a flag value that does not parse
    assert main(["stats", "--json", "--plot"]) == 2
    assert main(["models", "pull", "no-such-model", "--profile", "default"]) == 2  # ids or a profile, not both
    assert main(["generate", "--temperature", "-1", "--no-pull", "hello"]) == 2  # checked before any model loads
    assert main(["serve", "--port", "99999", "--no-pull"]) == 2  # a flag value out of range
    assert main(["serve", "--ssl-certfile", "cert.pem", "--no-pull"]) == 2  # TLS needs the key too
    assert main(["serve", "--ssl-certfile", "/no/cert.pem", "--ssl-keyfile", "/no/key.pem", "--no-pull"]) == 1
    with pytest.raises(SystemExit) as exc:
        main(["models", "list", "--frobnicate"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "error: Unknown model 'no-such-model'." in err


def test_an_unknown_profile_from_settings_says_where_it_was_set(isolated_home, capsys):
    settings = isolated_home / "config" / "settings.toml"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('profile = "nonexistent"\n')
    assert main(["generate", "hi", "--local", "--no-pull"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {settings}: setting 'profile': Unknown profile 'nonexistent'.")
    assert f"Correct or remove it in {settings}." in err


@pytest.mark.parametrize("argv", [["edit", "{dir}/\x1b]0;pwned\x07\x1b[2J.py", "x"],
                                  ["models", "info", "{dir}/\x1b[31mred.gguf"]])
def test_an_error_line_shows_control_characters_in_a_name_as_stand_ins(tmp_path, capsys, argv):
    """A file name (from a cloned repository, a shell glob) went into the error line raw: its escape
    sequences set the window title and cleared the screen of the terminal reading stderr."""
    assert main([a.format(dir=tmp_path) for a in argv]) in (1, 2)
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "\ufffd" in err and not any(c in err for c in "\x1b\x07")


def test_an_engine_flag_out_of_range_is_a_usage_error_naming_the_flag(capsys):
    """`--n-ctx 10` was exit status 1 saying "Engine setting 'n_ctx'", where `--max-tokens 0` is 2."""
    assert main(["generate", "--no-pull", "--local", "--mode", "off", "--n-ctx", "10", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: Invalid --n-ctx 10: ") and len(err.splitlines()) == 2


def test_a_keep_alive_that_is_no_duration_is_refused_before_any_model_loads(capsys):
    # An unknown model would fail with status 1 when looked up: 2 means the flag was refused first.
    assert main(["generate", "hi", "--keep-alive", "xyz", "--local", "--no-pull", "--model", "no-such-model"]) == 2
    assert capsys.readouterr().err.startswith("error: Invalid --keep-alive: keep_alive 'xyz' is not a duration")


def test_a_prompt_that_is_not_utf8_is_refused_before_any_model_loads(capsys):
    # argv keeps the byte 0xff as a lone surrogate; an unknown model would fail later with status 1.
    assert main(["generate", "hi \udcff", "--local", "--no-pull", "--model", "no-such-model"]) == 2
    assert "error: The prompt is not valid UTF-8 (byte 0xff at character 3)." in capsys.readouterr().err
    assert main(["edit", "any.py", "tidy \udcff", "--local", "--no-pull"]) == 2
    assert "error: The instruction is not valid UTF-8" in capsys.readouterr().err


def test_standard_input_that_is_not_utf8_is_one_line():
    out = subprocess.run([sys.executable, "-m", "localspec", "generate", "-", "--local", "--no-pull", "--model",
                          "no-such-model"], input=b"hi \xff", capture_output=True, timeout=120, env=_env())
    err = out.stderr.decode()
    assert out.returncode == 2 and err.startswith("error: The prompt is not valid UTF-8 (byte 0xff")
    assert "Traceback" not in err


def test_one_pair_file_is_a_usage_error(tmp_path, capsys):
    one = tmp_path / "one.jsonl"
    one.write_text(json.dumps({"a": "x", "b": "y", "label": "hit"}) + "\n")
    assert main(["cache", "train-scorer", "--file", str(one), "--out", str(tmp_path / "w.json")]) == 2
    assert "at least two pair files" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["", "missing/export.jsonl"])  # a directory; a folder that does not exist
def test_cache_export_to_a_path_it_cannot_write_is_one_line(tmp_path, capsys, out):
    path = tmp_path / out
    assert main(["cache", "export", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: Cannot write {path} (the export file): ") and len(err.splitlines()) == 2


def test_bench_from_a_missing_result_is_one_line(tmp_path, capsys):
    assert main(["bench", "--from-json", str(tmp_path / "nope.json"), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: Cannot read {tmp_path / 'nope.json'}") and "Traceback" not in err


@pytest.mark.parametrize("result", [{"runs": []}, {"runs": [], "schema": 1, "machine": {}, "command": "", "plan": "quick",
                                               "summary": [], "acceptance_by_position": {}, "goals": {}}])
def test_bench_from_a_result_missing_its_parts_is_one_line_and_writes_nothing(tmp_path, capsys, result):
    """A bench.json cut short or from another version was a traceback (ValueError, AttributeError)."""
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    assert main(["bench", "--from-json", str(path), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is not a whole bench result") and len(err.splitlines()) == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [b"\xff\xfe{}\n", b"not json\n", b"[1, 2]\n", b'{"a": "x"}\n'])
@pytest.mark.parametrize("argv", [["router", "train", "{f}", "--no-embedding", "--out", "{dir}/w.json"],
                                  ["router", "eval", "--tasks", "{f}", "--limit", "1"],
                                  ["cache", "eval", "--file", "{f}", "--exact-only"]])
def test_a_hostile_jsonl_file_is_one_line_naming_it(tmp_path, capsys, argv, content):
    """Bytes that are not UTF-8 were a traceback in all three; any bad line was one in `cache eval`."""
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    assert main([a.format(f=path, dir=tmp_path) for a in argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}") and len(err.splitlines()) == 2 and "Traceback" not in err


# ---------------------------------------------------------------- one name per option


def _visible_options() -> dict[str, list[tuple[str, ...]]]:
    seen: dict[str, list[tuple[str, ...]]] = {}
    for path, parser in subcommands(PARSER):
        for action in parser._actions:
            if action.help != argparse.SUPPRESS:
                for option in action.option_strings:
                    seen.setdefault(option, []).append(path)
    return seen


def test_one_spelling_per_option_across_verbs():
    visible = _visible_options()
    for old in ("--output", "--save", "--judge", "--no-judge", "--no-cache-judge"):
        assert old not in visible, f"{old} is still offered by {visible[old]}"
    parsers = dict(subcommands(PARSER))
    judges = [(path, a) for path, p in parsers.items() for a in p._actions if "--cache-judge" in a.option_strings]
    assert {path for path, _ in judges} == {("serve",), ("chat",), ("cache", "eval")}
    # serve and chat leave an unset flag to settings.toml's [cache] judge, whose default is the same "model".
    from localspec.settings import CacheTable

    assert CacheTable().judge == "model"
    assert all(tuple(a.choices) == CACHE_JUDGES and a.default == (None if path in (("serve",), ("chat",)) else "model")
               for path, a in judges)
    # A file a verb writes is --out everywhere (bench's --out is its output directory).
    writers = {path for path in visible.get("--out", [])}
    assert {("stats",), ("router", "eval"), ("router", "train"), ("cache", "eval"), ("cache", "train-scorer")} <= writers


@pytest.mark.parametrize("argv, dest, value, note", [
    (["cache", "eval", "--judge", "none"], "cache_judge", "rules", "--judge none is deprecated; use --cache-judge"),
    (["cache", "eval", "--judge", "scorer"], "cache_judge", "scorer", "--judge scorer is deprecated; use --cache-judge"),
    (["cache", "eval", "--no-judge"], "cache_judge", "rules", "--no-judge is deprecated; use --cache-judge rules"),
    (["serve", "--no-cache-judge"], "cache_judge", "rules", "--no-cache-judge is deprecated; use --cache-judge rules"),
    (["chat", "--no-cache-judge"], "cache_judge", "rules", "--no-cache-judge is deprecated; use --cache-judge rules"),
    (["cache", "eval", "--save", "r.json"], "out", Path("r.json"), "--save r.json is deprecated; use --out"),
    (["router", "train", "l.jsonl", "--output", "w.json"], "out", Path("w.json"), "--output w.json is deprecated; use --out"),
    (["stats", "--output", "rows.csv"], "out", Path("rows.csv"), "--output rows.csv is deprecated; use --out"),
    (["router", "eval", "--json", "r.json"], "out", Path("r.json"), "--json r.json is deprecated; use --out r.json"),
])
def test_old_spellings_still_work_with_a_one_line_note(argv, dest, value, note, capsys):
    assert getattr(PARSER.parse_args(argv), dest) == value
    assert capsys.readouterr().err == f"localspec: {note}\n"


def test_new_spellings_parse_silently(capsys):
    args = PARSER.parse_args(["cache", "eval", "--cache-judge", "rules", "--out", "r.json"])
    assert (args.cache_judge, args.out) == ("rules", Path("r.json"))
    args = PARSER.parse_args(["router", "eval", "--json"])
    assert args.json is True and args.out is None
    with pytest.raises(SystemExit):
        PARSER.parse_args(["cache", "eval", "--cache-judge", "none"])  # one set of values: model, scorer, rules
    assert "deprecated" not in capsys.readouterr().err


def test_modes_are_the_engines():
    from localspec.engine.config import MODES as ENGINE_MODES

    assert MODES == ENGINE_MODES


# ---------------------------------------------------------------- tables


def test_a_table_too_wide_is_stacked_with_ids_whole():
    t = Table(title="models")
    for col in ("id", "role", "source", "fit"):
        t.add_column(col)
    t.add_row("qwen2.5-coder-1.5b-instruct-q4_k_m", "target", "local file /a/very/long/path/to/the/model.gguf",
              "fits in RAM")
    t.add_row("tiny", "draft", "", "too large")
    lines = stacked(t, 40).splitlines()
    assert lines[:2] == ["models", "qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert "  source local file /a/very/long/path/to/the/model.gguf;" in lines  # a field is never split
    assert all(len(ln) <= 40 for ln in lines if "/a/very" not in ln)
    assert lines[-2:] == ["tiny", "  role draft; fit too large"]  # empty cells are left out


def test_models_list_at_80_columns_keeps_every_id(monkeypatch, capsys):
    from localspec.models import ModelManager

    monkeypatch.setenv("COLUMNS", "80")
    assert main(["models", "list", "--no-fit"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "…" not in out and all(len(ln) <= 80 for ln in lines)
    assert set(ModelManager().registry.ids()) <= set(lines)  # each id on a line of its own, whole


def test_stats_json_has_the_summary_and_drift(tmp_path, capsys):
    import time

    from tests.test_metrics import _history, _seed

    db = tmp_path / "m.sqlite"
    _seed(db, _history(time.time(), shifted=True, n=3))
    assert main(["stats", "--db", str(db), "--since", "30d", "--by", "mode", "--drift", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [g["group"] for g in report["groups"]] == ["draft"] and report["groups"][0]["requests"] == 24
    assert {d["metric"] for d in report["drift"]} >= {"acceptance_rate", "tokens_per_second"}


# ---------------------------------------------------------------- profiles


def test_profiles_say_what_each_needs(capsys):
    from localspec.models import ModelManager

    mm = ModelManager()
    assert main(["profiles", "--json"]) == 0
    profiles = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert set(profiles) == set(mm.registry.profiles)
    for name, p in profiles.items():
        prof = mm.profile(name)
        wanted = [(r, getattr(prof, r)) for r in ("target", "draft", "small", "embedding") if getattr(prof, r)]
        assert [(m["role"], m["id"]) for m in p["models"]] == wanted
        for m in p["models"]:
            assert m["installed"] == (mm.installed_path(m["id"]) is not None)
            assert m["size_basis"] in ("installed", "download", "estimate", "unknown")
        assert p["fit"]["verdict"] in ("fits in VRAM", "fits in RAM", "too large", "unknown")
        assert p["ready"] == all(m["installed"] for m in p["models"] if m["role"] in ("target", "draft"))
    assert profiles[mm.registry.default_profile]["default"] is True
    big = profiles["qwen-32b"]["models"][0]
    if not big["installed"]:  # no file sizes in the registry: estimated from 32.8 B parameters at Q4_K_M
        assert big["size_basis"] == "estimate" and 18e9 < big["size"] < 22e9


def test_a_profile_name_and_description_reach_the_terminal_without_escape_sequences(capsys):
    """models.toml's profile names and descriptions are any text: "\x1b]0;..." set the window title."""
    from tests.models_helpers import write_overlay

    write_overlay('[profiles."p\\u001b[2J"]\ntarget = "%s"\ndescription = "d \\u001b]0;title\\u0007"\n' % TARGET_ID)
    assert main(["profiles"]) == 0
    out = capsys.readouterr().out
    assert "p\ufffd[2J: d \ufffd]0;title\ufffd" in out and "\x1b" not in out and "\x07" not in out


def test_the_active_profile_is_marked_and_is_what_a_bare_pull_fetches(monkeypatch, capsys):
    """settings.toml's profile (here $LOCALSPEC_PROFILE) is what serve, chat and generate load: a bare
    `models pull` fetched the registry's default instead, and `profiles` did not say which was in use."""
    from localspec.models import ModelManager
    from localspec.models.manager import ProfilePull

    monkeypatch.setenv("LOCALSPEC_PROFILE", "qwen-7b")
    assert main(["profiles", "--json"]) == 0
    profiles = {p["name"]: p for p in json.loads(capsys.readouterr().out)}
    assert profiles["qwen-7b"]["active"] is True and profiles["default"]["active"] is False
    assert main(["profiles", "qwen-7b"]) == 0
    assert capsys.readouterr().out.startswith("qwen-7b (active)")
    pulled: list[str | None] = []

    def pull_profile(self, name=None, **kw):
        pulled.append(name)
        return ProfilePull(profile=name or "default")

    monkeypatch.setattr(ModelManager, "pull_profile", pull_profile)
    assert main(["models", "pull"]) == 0 and main(["models", "pull", "--profile", "default"]) == 0
    assert pulled == ["qwen-7b", "default"]
    monkeypatch.setenv("LOCALSPEC_PROFILE", "no-such-profile")
    assert main(["models", "pull"]) != 0
    assert "LOCALSPEC_PROFILE" in capsys.readouterr().err  # where the unknown name was set


def test_profiles_text_names_each_model_and_its_state(target_path, draft_path, capsys):
    assert main(["profiles", "default"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("default (default): ")
    assert f"  target     {TARGET_ID}  installed" in out and f"  draft      {DRAFT_ID}  installed" in out
    assert "; ready; " in out and ("fits in RAM" in out or "fits in VRAM" in out)


# ---------------------------------------------------------------- doctor


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_doctor_passes_a_healthy_install_without_the_optional_embedding_model(tmp_path, target_path, draft_path):
    home = tmp_path / "home"
    (home / "config").mkdir(parents=True)
    (home / "config" / "models.toml").write_text(
        'default_profile = "healthy"\n\n'
        '[profiles.healthy]\n'
        f'target = "{TARGET_ID}"\ndraft = "{DRAFT_ID}"\nembedding = "absent-embedding"\nn_ctx = 1024\n\n'
        '[[models]]\nid = "absent-embedding"\nrole = "embedding"\n')
    env = _env(LOCALSPEC_HOME=str(home), LOCALSPEC_MODELS_DIR=str(SHARED_STORE))
    proc = subprocess.run([sys.executable, "-m", "localspec", "doctor", "--json", "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=120, env=env)
    report = json.loads(proc.stdout)
    assert report["problems"] == [] and report["ok"] is True, report["problems"]
    assert proc.returncode == 0
    assert [w["fix"] for w in report["warnings"]] == ["Run `localspec models pull absent-embedding`."]
    text = subprocess.run([sys.executable, "-m", "localspec", "doctor", "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=120, env=env)
    assert text.returncode == 0 and "no problems found" in text.stdout
    assert "warning (optional): The embedding model 'absent-embedding' is not installed" in text.stdout


# ---------------------------------------------------------------- a closed pipe


@pytest.mark.parametrize("argv", [["models", "list", "--json"], ["models", "list"], ["profiles"],
                                  ["router", "eval", "--from-outcomes", "--no-embedding", "--resamples", "20",
                                   "--folds", "2"], ["--help"]])
def test_a_reader_that_went_away_ends_quietly(argv):
    """Standard output is a pipe whose reader has already closed it: the first write fails."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "localspec", *argv], stdout=write_end, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, timeout=120, env=_env(COLUMNS="80"))
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode in ((0, 141) if argv == ["--help"] else (141,))  # argparse's help ignores the error


# ---------------------------------------------------------------- shell completion


COMPLETE = r'''
eval "$(register-python-argcomplete localspec)"
complete_line() {
  COMP_LINE="$1"; COMP_POINT=${#COMP_LINE}
  read -ra COMP_WORDS <<< "$COMP_LINE"
  [[ "$COMP_LINE" == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
  COMPREPLY=()
  _python_argcomplete localspec "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
  printf '%s\n' "${COMPREPLY[@]}"
}
complete_line "$1"
'''


def _complete(line: str) -> list[str]:
    register = Path(sys.executable).parent / "register-python-argcomplete"
    if not register.is_file():
        pytest.skip("argcomplete is not installed")
    script = Path(sys.executable).parent / "localspec"
    env = _env(PATH=f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    proc = subprocess.run(["bash", "-c", COMPLETE, "complete", line], capture_output=True, text=True, timeout=60,
                          env=env)
    return [w.strip() for w in proc.stdout.splitlines() if w.strip()]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completes_verbs_model_ids_profiles_and_values():
    assert _complete("localspec mo") == ["models"]
    assert set(_complete("localspec models rm qwen2.5-coder-1")) == {"qwen2.5-coder-1.5b-instruct-q4_k_m",
                                                                      "qwen2.5-coder-14b-instruct-q4_k_m"}
    assert set(_complete("localspec serve --profile qwen-")) == {"qwen-7b", "qwen-14b", "qwen-32b"}
    assert _complete("localspec cache eval --cache-judge ") == list(CACHE_JUDGES)
    assert set(_complete("localspec cache eval --ju")) == {"--judge-model", "--judge-threshold"}  # aliases hidden


def test_the_completion_marker_is_where_argcomplete_looks():
    head = (REPO / "localspec" / "cli" / "__init__.py").read_bytes()[:1024]
    assert b"PYTHON_ARGCOMPLETE_OK" in head
    assert set(leaf_commands(PARSER)) >= {("profiles",), ("models", "list")}


def test_an_interrupted_pull_says_what_it_kept(monkeypatch, capsys):
    """Ctrl+C in a pull printed "interrupted" alone, though the bytes are kept and the next pull resumes."""
    from localspec.models import ModelManager

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(ModelManager, "pull", interrupted)
    assert main(["models", "pull", DRAFT_ID]) == 130
    assert capsys.readouterr().err.strip() == "interrupted; what was downloaded is kept: the same command resumes it"
