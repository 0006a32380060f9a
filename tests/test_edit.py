"""`localspec edit`: the task's prompt and prediction, reading the reply back as a whole file (or
refusing it, saying why), the atomic write with a backup, and the verb itself.

The verb runs against a real server on loopback whose scripted model answers the edit (through the
official `openai` client, as `--connect` does); the last tests run the real models (stage 2): a
local edit with the file as the prediction, and a file too big for the model's trained context,
refused with the numbers before any weights load.
"""

from __future__ import annotations

import json
import os
import stat

import pytest

from localspec.cli import main
from localspec.edit.files import read_source, write_with_backup
from localspec.edit.reply import NotWholeFile, extract_file
from localspec.edit.task import EditTask, fence_for
from localspec.errors import UsageError
from localspec.server import ServerSettings
from tests.common import DRAFT_ID, TARGET_ID, TEST_THREADS
from tests.fake_tier import scripted, scripted_app, scripted_costs, scripted_pipeline, scripted_tier
from tests.server_harness import ServerThread, request, wait_until

FILE = "def area(width, height):\n    return width * height\n\n\nprint(area(2, 3))\n"
TYPED = FILE.replace("area(width, height):", "area(width: float, height: float) -> float:")


def fenced(text: str, lang: str = "python") -> str:
    return f"```{lang}\n{text}```"


# ---------------------------------------------------------------------- the task


def test_the_prediction_is_the_file_fenced_as_the_prompt_fences_it():
    task = EditTask(name="geo.py", text=FILE, instruction="Add type hints")
    assert task.prediction() == fenced(FILE)
    system, user = task.messages()
    assert system.role == "system" and "whole edited file" in system.content
    assert user.content.startswith("Add type hints\n") and task.prediction() in user.content


def test_a_file_holding_fences_gets_a_longer_fence():
    doc = "# Notes\n\n```python\nx = 1\n```\n"
    assert fence_for(doc) == "````"
    task = EditTask(name="notes.md", text=doc, instruction="fix typos")
    assert task.prediction() == f"````markdown\n{doc}````"
    # and reading a reply so fenced back gives the file, inner fences included
    assert extract_file(task.prediction(), original=doc, finish_reason="stop") == doc


# ---------------------------------------------------------------------- the reply


def test_a_reply_with_one_block_is_the_file_prose_around_it_ignored():
    reply = f"Here is the file:\n{fenced(TYPED)}\nI added hints."
    assert extract_file(reply, original=FILE, finish_reason="stop") == TYPED


def test_the_final_newline_follows_the_original():
    assert extract_file(fenced(TYPED), original=FILE, finish_reason="stop").endswith("\n")
    no_newline = FILE.rstrip("\n")
    assert not extract_file(fenced(TYPED), original=no_newline, finish_reason="stop").endswith("\n")
    assert extract_file("```\nx = 1\n```", original="x = 0\n", finish_reason="stop") == "x = 1\n"


@pytest.mark.parametrize(("reply", "finish", "says"), [
    (fenced(TYPED), "length", "token limit of 99 tokens"),
    (fenced(TYPED), "cancelled", "finish reason 'cancelled'"),
    ("def area(width: float, height: float) -> float:\n    return width * height\n", "stop", "no fenced code block"),
    (fenced("x = 1\n") + "\nand\n" + fenced("y = 2\n"), "stop", "2 code blocks (lines 1, 5)"),
    ("Sure:\n```python\ndef area(width, height):\n", "stop", "opened on line 2 of the reply is never closed"),
    (fenced("def area(width: float, height: float) -> float:\n    # ... rest of the file unchanged\n"), "stop",
     "line 2 of the code block elides code ('# ... rest of the file unchanged')"),
    (fenced("def area(w, h):\n    ...\n"), "stop", "elides code ('...')"),
])
def test_a_reply_that_is_not_a_whole_file_is_refused_saying_why(reply, finish, says):
    with pytest.raises(NotWholeFile) as exc:
        extract_file(reply, original=FILE, finish_reason=finish, max_tokens=99)
    assert says in str(exc.value)


def test_an_ellipsis_the_file_itself_has_is_not_an_elision():
    stub = "class Shape:\n    def area(self) -> float:\n        ...\n"
    edited = stub.replace("Shape", "Figure")
    assert extract_file(fenced(edited), original=stub, finish_reason="stop") == edited


def test_trailing_blank_lines_survive_and_an_unchanged_reply_is_the_file():
    for original in ("a\n\n", "x = 1\n\n\n", "no newline", "a\n"):
        task = EditTask(name="f.py", text=original, instruction="change nothing")
        assert extract_file(task.prediction(), original=original, finish_reason="stop") == original


@pytest.mark.parametrize("line", ["/* ... */", "<!-- ... -->", "# ... 120 lines unchanged",
                                  "// rest of the file unchanged", "# Rest of the class is the same"])
def test_more_spellings_of_an_elision_are_refused(line):
    with pytest.raises(NotWholeFile, match="elides code"):
        extract_file(fenced(f"def area(width, height):\n    {line}\n"), original=FILE, finish_reason="stop")


def test_a_spread_is_not_an_elision():
    js = "function f(props) {\n  const {a,\n    ...others,\n  } = props;\n}\n"
    renamed = js.replace("...others,", "...rest,")  # "rename others to rest": a new line, not an elision
    assert extract_file(fenced(renamed, "js"), original=js, finish_reason="stop") == renamed


def test_a_reply_under_half_the_file_is_refused_unless_allowed():
    big = "".join(f"def f{i}():\n    return {i}\n\n\n" for i in range(10))
    part = "def f0():\n    return 100\n"
    with pytest.raises(NotWholeFile, match="has 2 lines where the file has 40"):
        extract_file(fenced(part), original=big, finish_reason="stop")
    assert extract_file(fenced(part), original=big, finish_reason="stop", allow_shrink=True) == part


def test_terminal_output_drops_control_characters():
    from localspec.cli.output import printable

    assert printable("ok\x1b]0;pwned\x07 \x1b[2J\tx\n") == "ok\ufffd]0;pwned\ufffd \ufffd[2J\tx\n"


# ---------------------------------------------------------------------- the file


def test_binary_non_utf8_missing_and_directory_files_are_refused(tmp_path):
    cases = {
        "blob.bin": (b"\x7fELF\x00\x01", "looks binary (a NUL byte at offset 4)"),
        "latin.txt": ("caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 3 cannot be decoded)"),
        "bom.py": ("\ufeffx = 1\n".encode(), "byte-order mark"),
    }
    for name, (data, says) in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(UsageError, match=r"\(") as exc:
            read_source(tmp_path / name)
        assert says in str(exc.value), name
    with pytest.raises(UsageError, match="does not exist"):
        read_source(tmp_path / "nope.py")
    with pytest.raises(UsageError, match="not a regular file"):
        read_source(tmp_path)


def test_write_keeps_a_backup_the_mode_and_the_line_ends(tmp_path):
    path = tmp_path / "win.py"
    path.write_bytes(FILE.replace("\n", "\r\n").encode())
    path.chmod(0o750)
    source = read_source(path)
    assert source.text == FILE and source.newline == "\r\n"
    backup = write_with_backup(source, TYPED)
    assert backup.name == "win.py.bak" and backup.read_bytes() == FILE.replace("\n", "\r\n").encode()
    assert path.read_bytes() == TYPED.replace("\n", "\r\n").encode()
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    # a second edit keeps the first backup and adds the next one
    second = write_with_backup(read_source(path), FILE)
    assert second.name == "win.py.bak.1" and backup.read_bytes() == FILE.replace("\n", "\r\n").encode()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["win.py", "win.py.bak", "win.py.bak.1"]


def test_a_failed_write_leaves_the_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    source = read_source(path)

    def no_rename(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError):
        write_with_backup(source, TYPED)
    assert path.read_text() == FILE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["geo.py", "geo.py.bak"]


def test_a_planted_backup_symlink_is_not_written_through(tmp_path):
    path, hooks = tmp_path / "app.py", tmp_path / "hooks"
    path.write_text(FILE)
    hooks.mkdir()
    (tmp_path / "app.py.bak").symlink_to(hooks / "post-checkout")  # dangling: exists() says no
    backup = write_with_backup(read_source(path), TYPED)
    assert backup.name == "app.py.bak.1" and backup.read_text() == FILE and not backup.is_symlink()
    assert not (hooks / "post-checkout").exists() and path.read_text() == TYPED


def test_a_symlinked_file_edits_its_target_and_the_link_stays(tmp_path):
    real, link = tmp_path / "real.py", tmp_path / "link.py"
    real.write_text(FILE)
    link.symlink_to(real)
    write_with_backup(read_source(link), TYPED)
    assert link.is_symlink() and real.read_text() == TYPED and (tmp_path / "real.py.bak").read_text() == FILE


def test_a_file_changed_since_it_was_read_is_not_overwritten(tmp_path):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    source = read_source(path)
    path.write_text(FILE + "# saved in an editor meanwhile\n")
    with pytest.raises(UsageError, match="changed since the edit read it"):
        write_with_backup(source, TYPED)
    assert path.read_text().endswith("meanwhile\n") and not (tmp_path / "geo.py.bak").exists()


def test_mixed_line_ends_are_kept_byte_for_byte(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"a\r\nb\nc\r\n")
    source = read_source(path)
    assert source.newline == "\n" and source.text == "a\r\nb\nc\r\n"
    write_with_backup(source, source.text.replace("b", "B"))
    assert path.read_bytes() == b"a\r\nB\nc\r\n"


# ---------------------------------------------------------------------- the verb, through a server

MODEL = "scripted-large"
NOTES = "# a\n# b\n"  # a longer file: the reply's budget (from the file's size) holds the thought too
ANSWERS = {
    "Add type hints": fenced(TYPED),
    # A thinking model drafts in its thought, fences and all: the server sends it as reasoning_content,
    # the reply puts it back in its tags, and the file is read from the answer after it.
    "Think, then hint": "<think>\n" + fenced("x\n") + "</think>\n\n" + fenced(TYPED + NOTES),
    "Elide": fenced("def area(width, height):\n    # ... rest unchanged\n"),
    "Change nothing": fenced(FILE),
}


def _server(n_ctx: int = 512):
    tier = scripted_tier(model_id=MODEL, script=scripted(ANSWERS, default="No."), mode="lookup", n_ctx=n_ctx)
    # `edit` asks for auto: pinned costs, not a calibration timed on the scripted model's microsecond
    # passes, which made auto's choices (and the prediction's counts) depend on the box's load.
    tier.engine.costs = scripted_costs()
    settings = ServerSettings(parallel=2, max_tokens_cap=256, n_ctx=n_ctx, cache=False, router=False)
    with ServerThread(scripted_app(pipeline=scripted_pipeline(tiers=[tier]), settings=settings)) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60)
        yield server


@pytest.fixture(scope="module")
def srv(module_home):
    yield from _server()


@pytest.fixture
def fresh_srv(module_home):
    """A server that has answered nothing yet: on one that has, the same edit asked again copies the
    earlier answer (lookup's history), which beats the prediction, so the prediction's counts vary."""
    yield from _server()


def edit(srv, path, instruction, *extra: str) -> int:
    return main(["edit", str(path), instruction, "--connect", srv.base_url, "--max-tokens", "200", *extra])


def test_edit_through_a_server_prints_the_diff_and_the_prediction_counts(srv, tmp_path, capsys):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    assert edit(srv, path, "Add type hints") == 0
    out, err = capsys.readouterr()
    assert "-def area(width, height):\n+def area(width: float, height: float) -> float:\n" in out
    assert out.startswith("--- a/geo.py\n+++ b/geo.py\n")
    assert "prediction: " in err and "Not written: add --write" in err
    assert path.read_text() == FILE


def test_a_thinking_models_drafts_in_its_thought_are_not_the_file(module_home, tmp_path, capsys):
    """Read whole, the reply had two code blocks (the thought's and the answer's) and was refused."""
    path = tmp_path / "geo.py"
    path.write_text(FILE + NOTES)
    server = _server(n_ctx=1024)  # room for the thought beside the edit's prompt
    try:
        assert edit(next(server), path, "Think, then hint") == 0, capsys.readouterr().err
    finally:
        server.close()
    assert "+def area(width: float, height: float) -> float:\n" in capsys.readouterr().out


def test_edit_json_and_write_replace_the_file_keeping_a_backup(fresh_srv, tmp_path, capsys):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    assert edit(fresh_srv, path, "Add type hints", "--json", "--write") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["changed"] and record["written"] and record["text"] == TYPED and record["refused"] is None
    assert path.read_text() == TYPED and (tmp_path / "geo.py.bak").read_text() == FILE
    stats = record["stats"]
    # the file was the prediction: most of the reply was accepted from it
    assert stats["prediction_accepted"] > stats["completion_tokens"] // 2
    assert stats["prediction_accepted"] + stats["prediction_rejected"] <= stats["completion_tokens"] + 16


def test_a_write_that_fails_is_one_line_and_the_file_and_backup_stay(srv, tmp_path, capsys, monkeypatch):
    """A full disk (or a read-only folder, a file deleted meanwhile) at --write was a traceback after
    the whole reply had streamed."""
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    real = os.replace

    def no_space(src, dst):
        if os.fspath(dst) == str(path):
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", no_space)
    assert edit(srv, path, "Add type hints", "--write") == 1
    out, err = capsys.readouterr()
    assert "+def area(width: float, height: float) -> float:\n" in out  # the reply is not lost
    assert f"error: Cannot write {path}: No space left on device; it is unchanged" in err and "Traceback" not in err
    assert err.splitlines()[-1].startswith("  fix: ")
    assert path.read_text() == FILE and (tmp_path / "geo.py.bak").read_text() == FILE


def test_a_partial_reply_is_refused_and_nothing_written(srv, tmp_path, capsys):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    assert edit(srv, path, "Elide the body", "--write") == 1
    err = capsys.readouterr().err
    assert "not written, the reply is not a whole file: line 2 of the code block elides code" in err
    assert path.read_text() == FILE and not (tmp_path / "geo.py.bak").exists()


def test_an_unchanged_file_is_not_rewritten(srv, tmp_path, capsys):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    assert edit(srv, path, "Change nothing", "--write") == 0
    assert "No changes to" in capsys.readouterr().err and not (tmp_path / "geo.py.bak").exists()


def test_a_file_past_the_servers_context_gets_its_refusal(srv, tmp_path, capsys):
    path = tmp_path / "big.py"
    path.write_text("x = 1\n" * 400)
    assert edit(srv, path, "Add type hints") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the server answered 400: ") and "context" in err and len(err.strip().splitlines()) == 1


def test_an_unreachable_server_is_one_line(tmp_path, capsys):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    assert main(["edit", str(path), "tidy", "--connect", "http://127.0.0.1:9"]) == 1
    assert "Could not reach a server at http://127.0.0.1:9/v1" in capsys.readouterr().err


def test_an_unreachable_server_ends_its_line_with_one_full_stop(tmp_path, capsys):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    assert main(["edit", str(path), "tidy", "--connect", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[0] == "error: Could not reach a server at http://127.0.0.1:9/v1: Connection error."


@pytest.mark.parametrize("flag, value, says", [
    ("--temperature", "-1", "Invalid temperature"), ("--temperature", "9", "Invalid temperature"),
    ("--temperature", "nan", "Invalid temperature"), ("--seed", "-1", "Invalid seed"),
])
def test_a_bad_sampling_flag_is_a_usage_error_before_any_model_loads(tmp_path, capsys, flag, value, says):
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    # An unknown model would fail with status 1 at its lookup: 2 means the flag was refused first.
    assert main(["edit", str(path), "tidy", "--local", "--no-pull", "--model", "no-such-model", flag, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {says}: ") and "localspec edit --help" in err and "Traceback" not in err


def test_edit_attaches_to_a_running_server_and_loads_no_model(tmp_path, capsys, monkeypatch):
    """With `localspec serve` announced in serve.json, the edit goes through it: no second copy of
    the models, and the prediction's tokens still arrive marked (the server sends their origins)."""
    from localspec import service

    def no_engine(**_kw):
        raise AssertionError("the edit loaded a model although a server runs")

    monkeypatch.setattr(service, "open_engine", no_engine)
    tier = scripted_tier(model_id=MODEL, script=scripted(ANSWERS, default="No."), mode="lookup", n_ctx=512)
    settings = ServerSettings(parallel=1, max_tokens_cap=256, n_ctx=512, cache=False, router=False)
    path = tmp_path / "geo.py"
    path.write_text(FILE)
    with ServerThread(scripted_app(pipeline=scripted_pipeline(tiers=[tier]), settings=settings),
                      announce=settings) as server:
        assert wait_until(lambda: request(server.base_url, "GET", "/health").status_code == 200, timeout=60)
        assert main(["edit", str(path), "Add type hints", "--max-tokens", "200", "--mode", "lookup", "--json",
                     "--write"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["written"] and path.read_text() == TYPED
    assert record["stats"]["mode"] == "lookup" and record["stats"]["prediction_accepted"] > 0


# ---------------------------------------------------------------------- the real models (stage 2)


@pytest.mark.models
def test_a_local_edit_with_the_real_pair_takes_most_tokens_from_the_file(target_path, draft_path, tmp_path,
                                                                          capsys):
    source = ("def total_price(items):\n    result = 0\n    for item in items:\n"
              "        result += item.price * item.quantity\n    return result\n\n\n"
              "def describe(items):\n    return f'{len(items)} items, {total_price(items)} in all'\n")
    path = tmp_path / "shop.py"
    path.write_text(source)
    code = main(["edit", str(path), "Rename the function total_price to order_total everywhere.", "--no-pull",
                 "--model", TARGET_ID, "--draft-model", DRAFT_ID, "--threads", str(TEST_THREADS), "--json",
                 "--write"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0, record
    assert "order_total" in record["text"] and "total_price" not in record["text"]
    assert path.read_text() == record["text"] and (tmp_path / "shop.py.bak").read_text() == source
    stats = record["stats"]
    assert stats["prediction_accepted"] > stats["completion_tokens"] // 2, stats
    assert stats["tokens_per_pass"] > 2.0, stats


@pytest.mark.models
def test_a_file_past_the_trained_context_is_refused_with_the_numbers(target_path, tmp_path, capsys):
    path = tmp_path / "huge.py"
    path.write_text("".join(f"value_{i} = {i}\n" for i in range(12_000)))
    assert main(["edit", str(path), "Add type hints", "--no-pull", "--model", TARGET_ID, "--mode", "off"]) == 2
    err = capsys.readouterr().err
    assert "huge.py is " in err and "tokens of context (prompt " in err and "was trained on 32,768" in err
