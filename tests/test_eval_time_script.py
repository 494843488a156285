"""benchmarks/eval_time.py's record of the code a stage ran: the commit of a checkout, never that of
a checkout around a folder that is not one."""
from __future__ import annotations

import subprocess
from pathlib import Path

from scripts import load_script  # tests/scripts.py

ROOT = Path(__file__).resolve().parents[1]


def _script():
    return load_script("eval_time")


def test_the_code_is_named_by_its_own_commit_and_an_archive_inside_a_checkout_by_none(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                       capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("commit", "-qm", "a")
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    version = _script().code_version
    assert version(tmp_path) == commit
    (tmp_path / "a.txt").write_text("b\n")
    assert version(tmp_path) == commit + "+changes"
    archive = tmp_path / "before"  # an extracted archive of another commit, inside this checkout
    archive.mkdir()
    assert version(archive) == "unknown"
    assert version(tmp_path.parent / "no-such-folder") == "unknown"
