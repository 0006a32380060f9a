"""docs/architecture.md's request path names real code: every `Class.method` on it exists, and
every function it names is defined in the file it points at."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _request_path() -> str:
    text = (REPO / "docs/architecture.md").read_text(encoding="utf-8")
    section = text.split("## The request path, hop by hop", 1)[1]
    return section.split("```", 2)[1]


def test_the_request_path_fits_in_fifteen_lines():
    lines = [ln for ln in _request_path().splitlines() if ln.strip()]
    assert 0 < len(lines) <= 15, len(lines)


def test_every_hop_on_the_request_path_exists():
    block = _request_path()
    sources = {p.as_posix(): p.read_text(encoding="utf-8") for p in (REPO / "localspec").rglob("*.py")}
    everything = "\n".join(sources.values())
    missing = []
    for cls, method in re.findall(r"\b([A-Z]\w+)\.(\w+)\(", block):
        if not re.search(rf"class {cls}\b[\s\S]*?def {method}\(", everything):
            missing.append(f"{cls}.{method}")
    for name in re.findall(r"(?<![.\w])(_?[a-z]\w+)\(", block):
        if not re.search(rf"def {name}\(", everything):
            missing.append(name)
    for path in re.findall(r"\b([\w/]+\.py)\b", block):
        assert (REPO / "localspec" / path).exists() or any((REPO / "localspec").rglob(path)), path
    assert not missing, missing


def test_one_remote_client_every_face_and_the_remote_tier_share():
    """#28: the chat app's --connect, `generate`/`edit` against a server and the router's remote tier
    build their OpenAI client in one place (localspec.attach.remote.openai_client)."""
    import ast

    builders = []
    for path in (REPO / "localspec").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("OpenAI", "AsyncOpenAI"):
                    builders.append(path.relative_to(REPO).as_posix())
    assert builders == ["localspec/attach/remote.py"], builders


def test_the_remote_tier_keeps_a_hosted_apis_base_url_as_given():
    from localspec.router import RemoteTier, TierSpec

    tier = RemoteTier(TierSpec("remote", "remote", base_url="https://api.example.com/v1beta/openai", model="m"))
    client = tier.client()
    assert str(client.base_url).rstrip("/") == "https://api.example.com/v1beta/openai"
    assert client.max_retries == 0


def test_every_code_module_is_at_most_600_lines():
    """#28: a module a reader can hold in their head; data tables live in modules of their own."""
    long = {p.relative_to(REPO).as_posix(): n for p in (REPO / "localspec").rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, long
