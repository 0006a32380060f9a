"""Security properties that need no model: traversal, the template sandbox, no pickle, constant-time keys.

The endpoint's own defaults (loopback, key required off loopback, 401 shape) are in
tests/test_server_security.py; secrets in logs and the metrics DB are checked against a real
server in tests/test_fuzz_smoke.py.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from localspec.engine.chat import ChatMessage, render_chat
from localspec.errors import ConfigError, LocalspecError, RequestError
from localspec.models import ModelManager
from localspec.models.registry import FileSpec, check_model_id
from localspec.tui.store import Chat, ChatParams, export_chat, safe_filename
from tests.conftest import REPO
from tests.gguf_factory import make_gguf
from tests.models_helpers import tmp_store  # noqa: F401  (fixture: imports never touch the shared store)

PACKAGE = REPO / "localspec"
TRAVERSALS = ["../evil", "..", "a/b", "/etc/passwd", "..\\..\\evil", "a/../../b", "", ".", "x\x00y", "~/.ssh/id_rsa",
              "C:\\Windows\\evil", "%2e%2e%2fevil", "trail\n", "trail\r\n", "ok\nsecond"]


# ---------------------------------------------------------------- path traversal


@pytest.mark.parametrize("bad", TRAVERSALS)
def test_model_ids_cannot_name_a_path(bad):
    with pytest.raises(ConfigError):
        check_model_id(bad)
    mm = ModelManager()
    assert mm.installed_path(bad) is None  # unsafe ids are simply not installed
    with pytest.raises(LocalspecError):
        mm.require_path(bad)
    with pytest.raises(LocalspecError):
        mm.pull(bad)


@pytest.mark.parametrize("bad", ["../x.gguf", "a/b.gguf", "..", ".hidden.gguf", "..\\x.gguf", "", "x.gguf\n",
                                 "new\nline.gguf", "tab\t.gguf"])
def test_registry_file_names_cannot_name_a_path(bad):
    with pytest.raises(ValueError):
        FileSpec(name=bad)


@pytest.mark.parametrize("bad", [b for b in TRAVERSALS if b])
def test_import_cannot_write_outside_the_store(bad, tmp_path, tmp_store):  # noqa: F811
    gguf = make_gguf(tmp_path / "ok.gguf")
    mm = ModelManager()
    before = set(tmp_path.rglob("*"))
    with pytest.raises(LocalspecError):
        mm.import_file(gguf, model_id=bad)
    assert set(tmp_path.rglob("*")) == before  # not even the store was created
    assert mm.store.manifests() == []


@pytest.mark.parametrize("name", ["../../etc/passwd.gguf", "..\\..\\x.gguf", "....gguf", ".gguf", "/abs/x.gguf"])
def test_import_derives_a_safe_id_from_any_file_name(name, tmp_path):
    from localspec.models import overlay

    mid = overlay.id_from_filename(Path(name).name)
    assert check_model_id(mid) == mid


def test_import_of_a_missing_or_foreign_file_is_refused(tmp_path, tmp_store):  # noqa: F811
    mm = ModelManager()
    with pytest.raises(LocalspecError, match="No such file"):
        mm.import_file(tmp_path / ".." / "nope.gguf")
    not_gguf = tmp_path / "passwd.gguf"
    not_gguf.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(LocalspecError):
        mm.import_file(not_gguf)
    link = tmp_path / "link.gguf"
    link.symlink_to("/etc/hostname")
    with pytest.raises(LocalspecError):
        mm.import_file(link)


@pytest.mark.parametrize("title", ["../../evil", "/etc/passwd", "..", ".", "a/b\\c", "\x00", "", "...", "~root",
                                   "CON", "x" * 500, "../" * 50 + "etc/cron.d/evil"])
def test_chat_export_names_stay_in_the_export_directory(title, tmp_path):
    out = tmp_path / "exports"
    chat = Chat(id=1, title=title, system_prompt="", params=ChatParams(), created=0.0, updated=0.0)
    path = export_chat(chat, [], out)
    assert path.resolve().parent == out.resolve()
    assert path.name == safe_filename(title) and not path.name.startswith(".")
    assert [p.name for p in tmp_path.iterdir()] == ["exports"]


# ---------------------------------------------------------------- GGUF chat templates


HOSTILE_TEMPLATES = {
    "mro": "{{ ''.__class__.__mro__ }}",
    "subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "cycler_globals": "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "joiner_globals": "{{ joiner.__init__.__globals__ }}",
    "namespace_globals": "{{ namespace.__init__.__globals__ }}",
    "raise_exception_globals": "{{ raise_exception.__globals__ }}",
    "strftime_globals": "{{ strftime_now.__globals__['datetime'] }}",
    "message_dict_mutation": "{% set _ = messages[0].update({'role': 'system'}) %}{{ messages }}",
    "list_mutation": "{% set _ = messages.append(1) %}{{ messages }}",
    "format_string_escape": "{{ '{0.__class__.__mro__}'.format('') }}",
    "func_code": "{{ raise_exception.__code__.co_consts }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_chat_templates_are_refused(name):
    with pytest.raises(RequestError) as err:
        render_chat(HOSTILE_TEMPLATES[name], [ChatMessage(role="user", content="hi")])
    assert "unsafe" in str(err.value) or "template" in str(err.value)
    assert "<class" not in str(err.value) and "uid=" not in str(err.value)


def test_a_normal_template_still_renders():
    out = render_chat(None, [ChatMessage(role="user", content="hi")])
    assert out.endswith("<|im_start|>assistant\n") and "hi" in out


def _sources() -> list[tuple[Path, str]]:
    return [(p, p.read_text(encoding="utf-8")) for p in sorted(PACKAGE.rglob("*.py"))]


def test_every_template_renders_in_the_sandbox():
    """No module builds a plain jinja2 Environment or Template: GGUF templates only meet the sandbox."""
    offenders = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in ("Environment", "Template", "NativeEnvironment", "SandboxedEnvironment"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {name}(")
    assert offenders == []


# ---------------------------------------------------------------- no pickle, anywhere

_UNSAFE_LOADERS = re.compile(
    r"\bimport (c?pickle|dill|shelve|marshal|joblib)\b|\bfrom (c?pickle|dill|shelve|marshal|joblib) import"
    r"|allow_pickle\s*=\s*True|torch\.load\(|\byaml\.load\(|\beval\(|\bexec\("
)


def test_no_pickle_or_other_code_loading_deserialisers_in_the_package():
    hits = [f"{p.relative_to(REPO)}:{i}: {line.strip()}"
            for p, text in _sources() for i, line in enumerate(text.splitlines(), 1)
            if _UNSAFE_LOADERS.search(line) and not line.lstrip().startswith("#")]
    assert hits == []


def test_every_diskcache_uses_the_json_only_disk():
    """diskcache's default Disk pickles values; every Cache/Index/FanoutCache here must pass JSONOnlyDisk."""
    offenders = []
    for path, text in _sources():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in ("Cache", "FanoutCache", "Index", "Deque") \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "diskcache":
                disk = {kw.arg: kw.value for kw in node.keywords}.get("disk")
                if not (isinstance(disk, ast.Name) and disk.id == "JSONOnlyDisk"):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


# ---------------------------------------------------------------- keys


def test_api_key_is_compared_in_constant_time():
    from localspec.server import app as app_module

    src = inspect.getsource(app_module._Auth)
    assert "hmac.compare_digest" in src
    # No short-circuiting comparison of the key anywhere in the middleware.
    assert not re.search(r"(==|!=)\s*self\.key|self\.key\s*(==|!=)", src)


def test_gguf_named_like_a_path_imports_under_a_safe_id(tmp_path, tmp_store):  # noqa: F811
    """The store id comes from a sanitised file name; the GGUF's own metadata is never used as a path."""
    weird = tmp_path / "..weights;rm -rf ~.gguf"
    make_gguf(weird)
    rec = ModelManager().import_file(weird, role="draft")
    assert check_model_id(rec.model_id) == rec.model_id
    assert rec.path.resolve().parent == (tmp_store / rec.model_id).resolve()
    assert not rec.path.name.startswith(".")


@pytest.mark.parametrize("name", ["new\nline.gguf", "trail.gguf\n", "bell\a.gguf"])
def test_gguf_with_control_characters_in_its_name_is_stored_under_the_id(name, tmp_path, tmp_store):  # noqa: F811
    weird = make_gguf(tmp_path / name)
    rec = ModelManager().import_file(weird, role="draft")
    assert check_model_id(rec.model_id) == rec.model_id
    assert rec.path.name == f"{rec.model_id}.gguf" and rec.path.name.isprintable()
