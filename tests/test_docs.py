"""Docs that run: the README and docs/clients.md against a real `localspec serve`, their links, their length.

Model tests start `localspec serve` itself (a child process, the 0.5B as target, a free port) and
run each documented curl and `openai` block against it: tests/doc_blocks.py says which and how.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.common import DRAFT_ID, TEST_THREADS
from tests.doc_blocks import DOC_ADDRESS, DOC_MODEL, TEST_MODEL, Kind, answer_in, blocks_of, parse_blocks
from tests.serve_process import ServeProcess
from tests.server_harness import request

REPO = Path(__file__).resolve().parents[1]
RUN_DOCS = ["README.md", "docs/clients.md"]  # every bash/python block here is run or marked
LINKED_DOCS = ["README.md", "SECURITY.md", "packaging/README.md", *sorted(
    p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md"))]
# Blocks marked `<!-- not run: ... -->`, per file: a new one must be added here, in review's sight.
EXPECTED_NOT_RUN = {"README.md": 2, "docs/clients.md": 5}
README_MAX_LINES = 150
BLOCKS = blocks_of(REPO, RUN_DOCS)
RUNNABLE = [b for b in BLOCKS if b.kind in (Kind.CURL, Kind.PYTHON)]
BLOCK_TIMEOUT_S = 300


# ---------------------------------------------------------------- the docs themselves (no models)


def test_every_bash_and_python_block_is_run_or_marked_not_run():
    unmarked = [b.id for b in BLOCKS if b.kind is Kind.UNMARKED]
    assert not unmarked, f"blocks neither runnable (curl / openai) nor marked <!-- not run: REASON -->: {unmarked}"
    not_run = {p: sum(1 for b in BLOCKS if b.path == p and b.kind is Kind.NOT_RUN) for p in RUN_DOCS}
    assert not_run == EXPECTED_NOT_RUN, [(b.id, b.not_run) for b in BLOCKS if b.kind is Kind.NOT_RUN]
    for path in RUN_DOCS:
        kinds = {b.kind for b in RUNNABLE if b.path == path}
        assert kinds == {Kind.CURL, Kind.PYTHON}, f"{path} should show both a curl and an openai example"


def test_the_block_rule_flags_an_unmarked_command_and_counts_a_marked_one():
    doc = ("```bash\ncurl -s http://127.0.0.1:8000/v1/models\n```\n\n"
           "<!-- not run: needs Docker -->\n\n```bash\ndocker run x\n```\n"
           "```bash\nrm -rf build\n```\n```yaml\na: 1\n```\n```python\nprint(1)\n```\n")
    kinds = [(b.kind, b.not_run) for b in parse_blocks(doc, "x.md")]
    assert kinds == [(Kind.CURL, None), (Kind.NOT_RUN, "needs Docker"), (Kind.UNMARKED, None),
                     (Kind.OTHER, None), (Kind.UNMARKED, None)]
    block = parse_blocks(f'```python\nOpenAI(base_url="http://{DOC_ADDRESS}/v1"); m = "{DOC_MODEL}"\n```\n', "y.md")[0]
    assert block.for_server(4321) == f'OpenAI(base_url="http://127.0.0.1:4321/v1"); m = "{TEST_MODEL}"\n'


def test_an_answer_is_a_completion_a_finished_stream_or_printed_text():
    assert answer_in('{"choices": [{"message": {"content": "hi"}}]}', Kind.CURL) == "hi"
    assert answer_in('{"error": {"message": "no"}}', Kind.CURL) == ""
    assert answer_in('{"content": "a + b", "stop": true}', Kind.CURL) == "a + b"  # llama-server's /infill
    stream = 'data: {"choices": [{"delta": {"content": "a"}}]}\n\ndata: {"choices": [], "usage": {}}\n\ndata: [DONE]\n'
    assert answer_in(stream, Kind.CURL) == "a"
    assert answer_in(stream.replace("data: [DONE]\n", ""), Kind.CURL) == ""  # cut off
    assert answer_in("text\n", Kind.PYTHON) == "text" and answer_in("text\n", Kind.CURL) == ""


def test_the_readme_is_short():
    n = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines; move detail into docs/ and link it"


def test_the_readme_performance_summary_is_at_most_ten_lines():
    from localspec.bench import report

    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert report.SUMMARY.start in text and report.SUMMARY.end in text
    body = text.split(report.SUMMARY.start, 1)[1].split(report.SUMMARY.end, 1)[0].strip("\n")
    assert 0 < len(body.splitlines()) <= report.SUMMARY_MAX_LINES
    page = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    assert report.TABLES.start in page and "| suite |" in page


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", text, flags=re.M)}


def test_every_relative_link_points_to_a_file_and_heading_that_exist():
    broken = []
    for doc in LINKED_DOCS:
        path = REPO / doc
        text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue  # http:, https:, mailto:
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            if not dest.exists():
                broken.append(f"{doc}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{doc}: {target} (no such heading)")
    assert not broken, broken


def test_the_continue_config_names_the_documented_server_and_a_served_model():
    from localspec.models import ModelManager

    configs = [yaml.safe_load(b.code) for b in BLOCKS if b.path == "docs/clients.md" and b.lang == "yaml"]
    assert configs, "docs/clients.md lost its Continue config"
    for config in configs:
        assert {"name", "version", "schema"} <= set(config)
        for model in config["models"]:
            assert model["provider"] == "openai" and model["apiBase"] == f"http://{DOC_ADDRESS}/v1"
            assert ModelManager().resolve(model["model"]).id == ModelManager().profile(None).target


# ---------------------------------------------------------------- against the real server


@pytest.fixture(scope="module")
def docs_server(module_home, draft_path):
    """`localspec serve` with the 0.5B as target, as a user starts it (no key, loopback)."""
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_API_KEY" and not k.startswith("OPENAI_")}
    args = ["--model", DRAFT_ID, "--mode", "off", "--threads", str(TEST_THREADS), "--parallel", "2",
            "--n-ctx", "2048", "--no-pull"]
    with ServeProcess(args, env) as server:
        server.env = env
        yield server


def _run_block(block, server) -> subprocess.CompletedProcess[str]:
    code = block.for_server(server.port)
    if block.kind is Kind.CURL:
        if shutil.which("curl") is None:
            pytest.fail("curl is not installed, so the docs' curl examples cannot be checked")
        argv = ["bash", "-euo", "pipefail", "-c", code]
    else:
        argv = [sys.executable, "-c", code]
    return subprocess.run(argv, env=server.env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                          stdin=subprocess.DEVNULL)


@pytest.mark.models
@pytest.mark.parametrize("block", RUNNABLE, ids=[f"{b.id}-{b.kind.value}" for b in RUNNABLE])
def test_a_documented_example_runs_and_prints_an_answer(block, docs_server):
    proc = _run_block(block, docs_server)
    assert proc.returncode == 0, f"{block.id} exited {proc.returncode}:\n{proc.stderr[-2000:]}\n{proc.stdout[-2000:]}"
    assert answer_in(proc.stdout, block.kind).strip(), f"{block.id} printed no answer:\n{proc.stdout[-2000:]}"


# What Open WebUI sends to an "OpenAI API" connection, after its own processing. Based on
# open-webui/open-webui backend/open_webui/routers/openai.py (generate_chat_completion and
# get_headers_and_cookies) and utils/payload.py: it pops its `metadata`, sets
# stream_options.include_usage when streaming, marks the last message with cache_control (content
# parts), sends Content-Type, Bearer key and, with ENABLE_FORWARD_USER_INFO_HEADERS, the user's
# X-OpenWebUI-* headers, through aiohttp (whose User-Agent it keeps). Some versions leave their
# own fields (features, variables, chat_id) in the body.
def open_webui_headers(key: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {key}",
        "User-Agent": "Python/3.11 aiohttp/3.11.18",
        "Accept": "*/*",
        "Accept-Encoding": "gzip, deflate",
        "X-OpenWebUI-User-Name": "Ada Lovelace",
        "X-OpenWebUI-User-Id": str(uuid.uuid4()),
        "X-OpenWebUI-User-Email": "ada@example.com",
        "X-OpenWebUI-User-Role": "admin",
        "X-OpenWebUI-Chat-Id": str(uuid.uuid4()),
    }


def open_webui_chat(model: str) -> dict:
    return {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": "Hi!"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": [{"type": "text", "text": "Name one sorting algorithm, in one line.",
                                          "cache_control": {"type": "ephemeral"}}]},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 32,
        "features": {"image_generation": False, "code_interpreter": False, "web_search": False},
        "variables": {"{{USER_NAME}}": "Ada Lovelace", "{{CURRENT_DATE}}": "2026-12-04"},
        "chat_id": str(uuid.uuid4()),
    }


def check_open_webui_session(base_url: str, key: str, host: str | None = None) -> None:
    headers = open_webui_headers(key) | ({"Host": host} if host else {})
    listed = request(base_url, "GET", "/v1/models", headers=headers)  # "verify connection", then the model menu
    assert listed.status_code == 200, listed.text
    assert TEST_MODEL in {m["id"] for m in listed.json()["data"]}
    reply = request(base_url, "POST", "/v1/chat/completions", json_body=open_webui_chat(TEST_MODEL), headers=headers)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/event-stream")
    events = [line[len("data: "):] for line in reply.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()
    usage = chunks[-1]  # the usage chunk comes last, with no choices, as OpenAI sends it
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 0
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + usage["usage"]["completion_tokens"]
    assert all(c.get("usage") is None for c in chunks[:-1])


@pytest.mark.models
def test_an_open_webui_chat_request_streams_an_answer_and_a_usage_chunk(docs_server):
    check_open_webui_session(docs_server.base_url, key="sk-open-webui-connection-key")


@pytest.mark.models
@pytest.mark.parametrize("method,path", [("POST", "/api/push"), ("POST", "/api/copy"), ("POST", "/api/create")])
def test_the_apis_clients_md_lists_as_not_served_answer_404(docs_server, method, path):
    r = request(docs_server.base_url, method, path, json_body={"model": TEST_MODEL})
    assert r.status_code == 404 and "/api/pull" in r.json()["error"] and "localspec models" in r.json()["error"]


@pytest.mark.models
def test_the_responses_apis_hosted_parts_answer_400_naming_the_field(docs_server):
    body = {"model": TEST_MODEL, "input": "hi", "tools": [{"type": "file_search"}]}
    r = request(docs_server.base_url, "POST", "/v1/responses", json_body=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools" and "file_search" in r.text


@pytest.mark.models
def test_open_webui_in_docker_as_docs_clients_md_sets_it_up(module_home, draft_path, tmp_path):
    """Docker Desktop: no key, `--allowed-hosts host.docker.internal`; Docker on Linux: a key file."""
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_API_KEY"}
    common = ["--model", DRAFT_ID, "--mode", "off", "--threads", str(TEST_THREADS), "--parallel", "1",
              "--n-ctx", "2048", "--no-pull"]
    with ServeProcess(["--allowed-hosts", "host.docker.internal", *common], env) as server:
        docker_host = f"host.docker.internal:{server.port}"
        check_open_webui_session(server.base_url, "unused", host=docker_host)
        other_host = request(server.base_url, "GET", "/v1/models", headers={"Host": f"evil.example:{server.port}"})
        assert other_host.status_code == 403
    key = "k-" + uuid.uuid4().hex
    keys = tmp_path / "api-keys"
    keys.write_text(f"{key}\n", encoding="utf-8")
    keys.chmod(0o600)
    with ServeProcess(["--api-key-file", str(keys), *common], env) as server:
        docker_host = f"host.docker.internal:{server.port}"
        check_open_webui_session(server.base_url, key, host=docker_host)
        wrong_key = request(server.base_url, "GET", "/v1/models",
                            headers=open_webui_headers("wrong") | {"Host": docker_host})
        assert wrong_key.status_code == 401
