"""The one settings model: settings.toml and LOCALSPEC_* read in one place, untrusted, with one precedence."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localspec.cli import build_parser, main
from localspec.errors import ConfigError, UsageError
from localspec.settings import ServerTable, load_settings, write_profile


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "settings.toml"
    path.write_text(text, encoding="utf-8")
    return path


def _user_settings(text: str) -> Path:
    path = Path(os.environ["LOCALSPEC_HOME"]) / "config" / "settings.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_every_table_parses_into_its_typed_model(tmp_path):
    s = load_settings(_file(tmp_path, 'profile = "fast"\n[engine]\ndraft_k = 3\n[server]\nport = 9001\n'
                                      'allowed_hosts = ["a.local"]\n[cache]\nsemantic = true\njudge = "scorer"\n'
                                      '[router]\nenabled = false\n[metrics]\nstore_prompts = true\n'
                                      '[metrics.drift]\nmin_samples = 5\n'), environ={})
    assert s.profile == "fast" and s.engine_values() == {"draft_k": 3}
    assert s.server.port == 9001 and s.server.allowed_hosts == ["a.local"] and s.server.host == "127.0.0.1"
    assert s.cache.semantic and s.cache.judge == "scorer" and not s.router.enabled
    assert s.metrics.store_prompts and s.metrics.drift.min_samples == 5


def test_a_missing_file_is_the_defaults(tmp_path):
    s = load_settings(tmp_path / "none.toml", environ={})
    assert s.profile is None and s.engine_values() == {} and s.server == ServerTable() and s.serve_parallel == 4


def test_the_environment_beats_the_file(tmp_path):
    path = _file(tmp_path, 'profile = "a"\n[server]\nport = 9001\nhost = "127.0.0.2"\n[engine]\nn_threads = 2\n')
    env = {"LOCALSPEC_PROFILE": "b", "LOCALSPEC_SERVER__PORT": "9002", "LOCALSPEC_THREADS": "6",
           "LOCALSPEC_SERVER__ALLOWED_HOSTS": "x.local, y.local", "LOCALSPEC_METRICS__DRIFT__MIN_SAMPLES": "7",
           "LOCALSPEC_HOME": "/not/a/setting", "LOCALSPEC_MODEL_DIRS": "/neither"}
    s = load_settings(path, environ=env)
    assert (s.profile, s.server.port, s.server.host, s.engine.n_threads) == ("b", 9002, "127.0.0.2", 6)
    assert s.server.allowed_hosts == ["x.local", "y.local"] and s.metrics.drift.min_samples == 7
    # The newer spelling of the threads variable wins over the older one.
    assert load_settings(path, environ={"LOCALSPEC_THREADS": "6", "LOCALSPEC_ENGINE__N_THREADS": "3"}).engine.n_threads == 3


@pytest.mark.parametrize(("text", "expected", "fix"), [
    ("[server]\nprot = 1\n", "unknown setting 'server.prot'", "did you mean 'port'?"),
    ("[engin]\nn_ctx = 1\n", "unknown setting 'engin'", "did you mean 'engine'?"),
    ("[metrics.drift]\nwindow = 3\n", "unknown setting 'metrics.drift.window'", "[metrics.drift] takes:"),
    ("[server]\nport = 70000\n", "setting 'server.port'", "Correct or remove it in"),
    ("[engine]\nmode = \"fastest\"\n", "setting 'engine.mode'", "Correct or remove it in"),
    ("[cache]\njudge = \"oracle\"\n", "setting 'cache.judge'", "Correct or remove it in"),
    ("[server]\nkeep_alive = \"soon\"\n", "setting 'server.keep_alive'", "Correct or remove it in"),
    ('profile = "a\\u0007b"\n', "setting 'profile'", "Correct or remove it in"),
    ("[server]\nport = \n", "settings.toml", "Fix the TOML syntax"),
    ("server = 3\n", "setting 'server'", "Correct or remove it in"),
])
def test_bad_input_is_one_line_naming_the_key_the_file_and_the_fix(tmp_path, text, expected, fix):
    path = _file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert expected in info.value.cause and str(path) in info.value.cause and "\n" not in info.value.cause
    assert fix in info.value.fix


def test_a_bad_environment_value_names_the_variable(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path / "none.toml", environ={"LOCALSPEC_SERVER__PORT": "eighty"})
    assert info.value.cause.startswith("$LOCALSPEC_SERVER__PORT: setting 'server.port'")
    assert "unset $LOCALSPEC_SERVER__PORT" in info.value.fix
    with pytest.raises(ConfigError, match="unknown setting 'cache.enable'"):
        load_settings(tmp_path / "none.toml", environ={"LOCALSPEC_CACHE__ENABLE": "1"})


def test_the_api_key_is_refused_in_the_settings_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_settings(_file(tmp_path, '[server]\napi_key = "sk-secret"\n'), environ={})
    assert "server.api_key" in info.value.cause and "sk-secret" not in info.value.cause + info.value.fix
    assert "LOCALSPEC_API_KEY" in info.value.fix


def test_undecodable_or_unreadable_files_are_config_errors(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_bytes(b"[server]\nhost = \"\xff\"\n")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_settings(path, environ={})
    with pytest.raises(ConfigError, match="Cannot read"):
        load_settings(tmp_path, environ={})  # a directory


# ---------------------------------------------------------------- serve reads them


def _serve(*flags: str):
    from localspec.cli.serve_cmd import settings_from_args

    return settings_from_args(build_parser().parse_args(["serve", *flags]))


def test_serve_takes_each_table_and_flags_beat_settings(monkeypatch):
    _user_settings('profile = "p1"\n[server]\nport = 9001\nmax_body_mb = 1\nkeep_alive = "10m"\nmodel = "m"\n'
                   'allowed_hosts = ["h.local"]\nembeddings = false\n[engine]\nparallel = 2\nn_ctx = 2048\n'
                   '[cache]\nenabled = false\nsemantic = true\njudge = "rules"\n[router]\nenabled = false\n')
    s = _serve()
    assert (s.port, s.max_body_bytes, s.keep_alive, s.target, s.allowed_hosts) == (9001, 1 << 20, "10m", "m",
                                                                                  ["h.local"])
    assert (s.profile, s.parallel, s.embeddings) == ("p1", 2, False)
    assert s.n_ctx is None  # [engine] n_ctx is not a flag: engine_config reads it, under a model's own
    assert (s.cache, s.cache_semantic, s.cache_judge, s.router) == (False, True, "rules", False)
    s = _serve("--port", "9100", "--parallel", "3", "--profile", "p2", "--cache-judge", "scorer",
               "--allowed-hosts", "o.local")
    assert (s.port, s.parallel, s.profile, s.cache_judge, s.allowed_hosts) == (9100, 3, "p2", "scorer", ["o.local"])
    monkeypatch.setenv("LOCALSPEC_SERVER__PORT", "9200")
    assert _serve().port == 9200 and _serve("--port", "9300").port == 9300


def test_chat_takes_the_cache_table_and_its_flags_beat_it():
    """The one cache-settings object: an in-process `chat` reads [cache] as `serve` does."""
    from localspec.cli.chat_cmd import chat_cache

    def chat(*flags: str):
        return chat_cache(build_parser().parse_args(["chat", *flags]))

    assert chat().model_dump() == {"enabled": True, "semantic": False, "sampled": False, "judge": "model"}
    _user_settings('[cache]\nsemantic = true\nsampled = true\njudge = "rules"\n')
    assert chat().model_dump() == {"enabled": True, "semantic": True, "sampled": True, "judge": "rules"}
    assert chat("--cache-judge", "scorer", "--no-cache").model_dump() == {
        "enabled": False, "semantic": True, "sampled": True, "judge": "scorer"}


def test_open_pipeline_takes_the_cache_table_as_one_object():
    """The [cache] settings reach the pipeline as one typed CacheTable, not four loose keywords."""
    import inspect
    import typing

    from localspec.service import open_pipeline
    from localspec.settings import CacheTable
    from localspec.tui import LocalBackend

    for opener in (open_pipeline, LocalBackend.open):
        params = inspect.signature(opener).parameters
        assert params["cache"].kind is inspect.Parameter.KEYWORD_ONLY and params["cache"].default is None
        hints = typing.get_type_hints(opener, localns={"CacheTable": CacheTable})  # tui imports it to type only
        assert CacheTable in typing.get_args(hints["cache"])
        assert not {"cache_semantic", "cache_sampled", "cache_judge"} & set(params)


def test_chat_and_serve_hand_open_pipeline_their_cache_table(monkeypatch):
    """The in-process chat passes chat_cache's table through LocalBackend.open; serve builds one from its settings."""
    from localspec.cli.chat_cmd import make_app
    from localspec.server import ServerSettings
    from localspec.server.backend import Backend
    from localspec.settings import CacheTable

    class Opened(Exception):
        pass

    seen: list[CacheTable] = []

    def fake_open_pipeline(*_a, cache=None, **_kw):
        seen.append(cache)
        raise Opened

    monkeypatch.setattr("localspec.service.open_pipeline", fake_open_pipeline)
    _user_settings('[cache]\nsemantic = true\nsampled = true\n')
    args = build_parser().parse_args(["chat", "--local", "--cache-judge", "rules"])
    app = make_app(args, attached={None: None})
    with pytest.raises(Opened):
        app.backend_factory(None, on_progress=lambda *_: None)
    assert seen.pop() == CacheTable(enabled=True, semantic=True, sampled=True, judge="rules")

    with pytest.raises(Opened):
        Backend.load(ServerSettings(cache=False, cache_semantic=True, cache_judge="scorer"))
    assert seen.pop() == CacheTable(enabled=False, semantic=True, sampled=False, judge="scorer")


def test_serve_leaves_engine_settings_under_a_models_own_n_ctx(monkeypatch):
    from localspec.service import engine_config

    monkeypatch.delenv("LOCALSPEC_THREADS", raising=False)  # CI sets it, and the environment beats the file
    _user_settings('[engine]\nn_ctx = 2048\nmode = "off"\nn_threads = 3\n')
    s = _serve()
    assert (s.n_ctx, s.mode, s.n_threads) == (None, None, None)
    # What the backend hands open_engine: the settings' n_ctx sits under the model's own, a flag over both.
    assert engine_config(4096, model_n_ctx=8192, n_ctx=s.n_ctx, mode=s.mode, n_threads=s.n_threads).n_ctx == 8192
    config = engine_config(4096, n_ctx=s.n_ctx, mode=s.mode, n_threads=s.n_threads)
    assert (config.n_ctx, config.mode, config.n_threads) == (2048, "off", 3)
    flagged = _serve("--n-ctx", "512", "--mode", "draft")
    assert engine_config(4096, model_n_ctx=8192, n_ctx=flagged.n_ctx, mode=flagged.mode).n_ctx == 512


def test_a_bad_setting_that_serve_checks_names_the_key_and_the_file(monkeypatch):
    path = _user_settings("[server]\nmax_body_mb = 0.0001\n")
    with pytest.raises(ConfigError) as info:
        _serve()
    assert info.value.cause.startswith(f"{path}: setting 'server.max_body_mb'") and "None" not in info.value.cause
    assert "0.0001" in info.value.cause and "\n" not in info.value.cause
    monkeypatch.setenv("LOCALSPEC_SERVER__MAX_BODY_MB", "0.0002")
    with pytest.raises(ConfigError, match=r"^\$LOCALSPEC_SERVER__MAX_BODY_MB: setting 'server.max_body_mb'"):
        _serve()
    with pytest.raises(UsageError, match="Invalid --max-body-mb 0.0003"):
        _serve("--max-body-mb", "0.0003")


def test_serve_refuses_a_settings_file_named_but_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_SETTINGS", "")
    with pytest.raises(ConfigError, match="does not exist") as info:
        _serve("--settings", str(tmp_path / "missing.toml"))
    assert "missing.toml" in info.value.cause and "\n" not in info.value.cause


def test_serve_defaults_without_settings():
    s = _serve()
    assert (s.host, s.port, s.parallel, s.max_queue, s.cache, s.cache_judge, s.keep_alive, s.profile) == (
        "127.0.0.1", 8000, 4, 16, True, "model", "5m", None)


def test_serve_settings_flag_reads_another_file(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_SETTINGS", "")  # serve sets it for its process: restored after the test
    other = _file(tmp_path, "[server]\nport = 9444\n[engine]\ndraft_k = 2\n")
    assert _serve("--settings", str(other)).port == 9444
    from localspec.service import engine_config

    assert engine_config().draft_k == 2  # the engine, loaded later in the process, reads the same file


# ---------------------------------------------------------------- the active profile


def test_write_profile_keeps_the_rest_of_the_file(tmp_path):
    path = _file(tmp_path, "# mine\n[engine]\ndraft_k = 3\n")
    write_profile("fast", path)
    assert load_settings(path, environ={}).profile == "fast" and "# mine" in path.read_text()
    write_profile('we"ird', path)
    text = path.read_text()
    assert load_settings(path, environ={}).profile == 'we"ird' and text.count("profile =") == 1
    assert load_settings(path, environ={}).engine_values() == {"draft_k": 3}
    new = tmp_path / "sub" / "settings.toml"
    write_profile("p", new)
    assert load_settings(new, environ={}).profile == "p"


def test_write_profile_refuses_a_broken_file_and_a_bad_name(tmp_path):
    path = _file(tmp_path, "[engine\n")
    with pytest.raises(ConfigError, match="TOML"):
        write_profile("p", path)
    assert path.read_text() == "[engine\n"
    with pytest.raises(ConfigError, match="profile"):
        write_profile("a\nb", _file(tmp_path, ""))


def test_generate_honours_the_active_profile(monkeypatch):
    from localspec.cli import generate_cmd

    seen: list[str | None] = []
    monkeypatch.setattr(generate_cmd, "_run_local", lambda args, request, lora: seen.append(args.profile) or 0)
    _user_settings('profile = "qwen-7b"\n')  # a profile the registry knows: an unknown one is refused first
    assert main(["generate", "hi", "--local"]) == 0
    assert main(["generate", "hi", "--local", "--profile", "explicit"]) == 0
    assert seen == ["qwen-7b", "explicit"]


def test_edit_honours_the_active_profile(tmp_path, monkeypatch, capsys):
    """`edit` ignored settings.toml's profile: it loaded the registry default whatever the settings said."""
    from localspec.cli import edit_cmd
    from localspec.cli.edit_cmd import EditOutcome

    seen: list[str | None] = []

    def edited(args, task, stream):
        seen.append(args.profile)
        return EditOutcome(reply="", finish_reason="error", max_tokens=1, mode="off", completion_tokens=0, accepted=0,
                           prediction_accepted=None, prediction_rejected=None, decode_s=0.0, speedup=None,
                           error="stopped here")

    monkeypatch.setattr(edit_cmd, "_edit", edited)
    (tmp_path / "a.py").write_text("x = 1\n")
    _user_settings('profile = "qwen-7b"\n')
    assert main(["edit", str(tmp_path / "a.py"), "rename x to y"]) == 1
    assert main(["edit", str(tmp_path / "a.py"), "rename x to y", "--profile", "explicit"]) == 1
    assert seen == ["qwen-7b", "explicit"]
    _user_settings('profile = "no-such-profile"\n')
    assert main(["edit", str(tmp_path / "a.py"), "rename x to y"]) != 0
    assert "setting 'profile'" in capsys.readouterr().err and len(seen) == 2


def test_the_chat_app_starts_on_the_active_profile_and_writes_its_choice(tmp_path, monkeypatch):
    from localspec.cli.chat_cmd import make_app

    path = _user_settings('profile = "from-settings"\n')
    args = build_parser().parse_args(["chat"])
    app = make_app(args, attached={})
    assert app.active_profile == "from-settings"
    monkeypatch.setattr(type(app.chat_screen.loader), "load", lambda self, name: None)  # no model here
    app.set_active_profile("chosen")
    assert load_settings(path, environ={}).profile == "chosen"


def test_the_documented_settings_file_parses(tmp_path):
    """docs/configuration.md's example is a valid settings file, and names every table and [server] key."""
    import re

    from localspec.settings import Settings

    doc = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    block = re.search(r"```toml\n(.*?)```", doc, re.S)
    assert block is not None
    s = load_settings(_file(tmp_path, block.group(1)), environ={})
    assert s.profile == "default" and s.engine_values()["parallel"] == 4
    for table in Settings.model_fields:
        assert (f"[{table}]" if table != "profile" else "profile =") in block.group(1)
    for key in ServerTable.model_fields:
        assert re.search(rf"\b{key}\b", block.group(1)), key


def test_a_relative_path_in_the_file_is_beside_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "conf"
    conf.mkdir()
    path = conf / "settings.toml"
    path.write_text('[server]\napi_key_file = "keys"\nssl_certfile = "/abs/c.pem"\nssl_keyfile = "~/k.pem"\n')
    s = load_settings(path, environ={})
    assert s.server.api_key_file == conf / "keys" and s.server.ssl_certfile == Path("/abs/c.pem")
    assert s.server.ssl_keyfile == Path("~/k.pem").expanduser()
    s = load_settings(path, environ={"LOCALSPEC_SERVER__API_KEY_FILE": "mine"})
    assert s.server.api_key_file == Path("mine")  # the shell's meaning: the current directory


def test_write_profile_writes_through_a_symlinked_file(tmp_path):
    real = _file(tmp_path, "[engine]\ndraft_k = 3\n")
    link = tmp_path / "link.toml"
    link.symlink_to(real)
    write_profile("p", link)
    assert link.is_symlink() and load_settings(real, environ={}).profile == "p"


# ---------------------------------------------------------------- an adapter is not an [engine] setting


@pytest.mark.parametrize(("text", "env", "where"), [
    ('[engine]\nlora_path = "style.gguf"\n', {}, "settings.toml: setting 'engine.lora_path'"),
    ("[engine]\nlora_scale = 0.5\n", {}, "settings.toml: setting 'engine.lora_scale'"),
    ("", {"LOCALSPEC_ENGINE__LORA_PATH": "style.gguf"}, "$LOCALSPEC_ENGINE__LORA_PATH: setting 'engine.lora_path'"),
])
def test_an_adapter_in_engine_settings_is_refused_pointing_at_lora(tmp_path, text, env, where):
    with pytest.raises(ConfigError) as info:
        load_settings(_file(tmp_path, text), environ=env)
    assert where in info.value.cause and "\n" not in info.value.cause
    assert "--lora" in info.value.fix and "models.toml" in info.value.fix


# ---------------------------------------------------------------- the file is untrusted, its mode is kept


def test_write_profile_keeps_the_mode_and_the_line_ends(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_bytes(b"# mine\r\n[engine]\r\ndraft_k = 3\r\n")
    path.chmod(0o600)
    write_profile("fast", path)
    assert path.stat().st_mode & 0o777 == 0o600
    data = path.read_bytes()
    assert data.count(b"\r\n") == 4 and b"\n" not in data.replace(b"\r\n", b"")
    assert load_settings(path, environ={}).profile == "fast"
    assert [p.name for p in tmp_path.iterdir()] == ["settings.toml"]  # no temporary file left


def test_write_profile_never_follows_a_planted_temporary_link(tmp_path):
    path = _file(tmp_path, "[engine]\ndraft_k = 3\n")
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    (tmp_path / "settings.toml.tmp").symlink_to(victim)
    write_profile("p", path)
    assert victim.read_text() == "untouched" and load_settings(path, environ={}).profile == "p"


def test_an_oversized_or_special_settings_file_is_refused_without_blocking(tmp_path):
    big = _file(tmp_path, "# " + "x" * (1 << 20) + "\n")
    with pytest.raises(ConfigError, match="over 1 MiB"):
        load_settings(big, environ={})
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # no writer: a blocking open would hang here
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(fifo, environ={})
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(Path("/dev/zero"), environ={})
