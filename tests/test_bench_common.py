"""benchmarks/common.py: the record of where a result was measured, and a --json path refused up front."""
from __future__ import annotations

import json
import subprocess

import pytest

from scripts import load_script  # tests/scripts.py


@pytest.fixture(scope="module")
def common():
    return load_script("common")


def _git(folder, *args):
    subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_the_code_is_named_by_its_own_commit_and_an_archive_inside_a_checkout_by_none(common, tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-qm", "a")
    commit = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    assert common.git_commit(tmp_path) == commit
    (tmp_path / "a.txt").write_text("b\n")
    assert common.git_commit(tmp_path) == commit + "+changes"
    archive = tmp_path / "before"  # an extracted archive of another commit, inside this checkout
    archive.mkdir()
    assert common.git_commit(archive) == "unknown"
    assert common.git_commit(tmp_path.parent / "no-such-folder") == "unknown"


def test_the_environment_names_command_versions_and_commit(common, monkeypatch):
    monkeypatch.setattr("sys.argv", ["benchmarks/floor.py", "W.toml", "--json", "out.json"])
    env = common.environment("floor", gpu="NVIDIA H200")
    assert env["command"] == "python benchmarks/floor.py W.toml --json out.json"
    assert env["gpu"] == "NVIDIA H200"
    assert all(env[key] for key in ("torch", "python", "code", "date"))


def test_a_lab_script_named_by_its_path_is_recorded_by_that_path(common, monkeypatch):
    monkeypatch.setattr("sys.argv", ["lab/split_finish/probe.py", "--json", "out.json"])
    assert common.environment("lab/split_finish/probe.py")["command"] == \
        "python lab/split_finish/probe.py --json out.json"


def test_a_json_path_that_cannot_take_the_result_is_refused_before_parsing_ends(common, tmp_path, capsys):
    parser = common.make_parser("A script.\n\nMore.")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--json", str(tmp_path / "missing" / "out.json")])
    assert exit_.value.code == 2 and "--json" in capsys.readouterr().err
    assert parser.parse_args(["--json", str(tmp_path / "out.json")]).json == tmp_path / "out.json"


def test_write_json_writes_only_when_given_a_path(common, tmp_path):
    common.write_json(None, {"a": 1})
    common.write_json(tmp_path / "out.json", {"a": 1, "path": tmp_path})
    assert json.loads((tmp_path / "out.json").read_text()) == {"a": 1, "path": str(tmp_path)}
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_commit_named_in_the_environment_is_recorded_beside_the_checkouts_reading(common, monkeypatch):
    monkeypatch.setenv("CONJUGATE_CODE", "137b10d")  # the device's copy: a tree newer than its history
    env = common.environment("floor", gpu="NVIDIA H200")
    assert env["code"] == "137b10d" and env["checkout_code"] == common.git_commit()
    monkeypatch.setenv("CONJUGATE_CODE", "137b10d+changes")  # a tree that differs from that commit
    assert common.environment("floor", gpu="NVIDIA H200")["code"] == "137b10d+changes"
    monkeypatch.setenv("CONJUGATE_CODE", "main; rm -rf /")
    with pytest.raises(SystemExit, match="CONJUGATE_CODE"):
        common.environment("floor", gpu="NVIDIA H200")
    monkeypatch.delenv("CONJUGATE_CODE")
    assert "checkout_code" not in common.environment("floor", gpu="NVIDIA H200")
