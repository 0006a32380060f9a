"""CI runs the README's set-up commands byte for byte, and nothing else installs or tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / ".ci"))

from readme_commands import setup_commands  # noqa: E402


def test_the_extracted_commands_are_the_readmes_lines_verbatim():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    commands = setup_commands(readme)
    assert len(commands) == 2
    lines = readme.splitlines()
    for cmd in commands:
        assert cmd in lines
    assert commands[0].startswith("python3 -m venv .venv && .venv/bin/pip install")
    # Two stages, fast first: the suite without weights fails in minutes, before the models load.
    # The markers are complements (conftest puts every model or slow test in `models`), so together
    # the stages run every test once.
    steps = [part.strip() for part in commands[1].split("&&")]
    stages = [step for step in steps if "pytest" in step]
    # The fast stage runs on every core (pytest-xdist); the models stage in one process, so the
    # models load once and llama.cpp's threads have the cores to themselves.
    assert stages == ['.venv/bin/python -m pytest -m "not models" -n auto', ".venv/bin/python -m pytest -m models"], stages
    # The linter and the type checker (configured in pyproject.toml) run before any test.
    assert steps[1:3] == [".venv/bin/ruff check", ".venv/bin/mypy"], steps


def test_ci_itself_installs_and_tests_nothing_outside_the_readme():
    script = (REPO / ".ci" / "run").read_text()
    code = [line.split("#", 1)[0] for line in script.splitlines()]
    for word in ("pip ", "pytest", "venv", "localspec "):
        assert not any(word in line for line in code), f".ci/run runs {word.strip()!r} itself"


def test_ci_runs_each_readme_command_as_written_with_only_the_environment_added(tmp_path):
    repo = tmp_path / "clone"
    shutil.copytree(REPO / ".ci", repo / ".ci")
    (repo / "README.md").write_text(
        "# x\n\n## Set-up on a fresh machine\n\n```bash\n"
        "# 1. first\n"
        "printf '%s|%s\\n' \"one 'quoted' $((1+1))\" \"$LOCALSPEC_REQUIRE_MODELS\" > order.txt\n"
        "# 2. second\n"
        "echo \"two $LOCALSPEC_MODEL_DIRS\" >> order.txt && test -f order.txt\n"
        "```\n"
    )
    proc = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("LOCALSPEC_")})
    assert proc.returncode == 0, proc.stderr
    assert (repo / "order.txt").read_text().splitlines() == [
        "one 'quoted' 2|1", f"two {repo}/../shared/models"]
    assert proc.stdout.count("== README command") == 2


def test_a_failing_readme_command_fails_ci(tmp_path):
    repo = tmp_path / "clone"
    shutil.copytree(REPO / ".ci", repo / ".ci")
    (repo / "README.md").write_text("## Set-up\n```bash\nfalse && true\necho never > ran.txt\n```\n")
    proc = subprocess.run(["bash", ".ci/run"], cwd=repo, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and not (repo / "ran.txt").exists()
