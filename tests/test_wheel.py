"""A non-editable install works from any directory: the wheel carries the code and the shipped files
(plans/, evaluators/, examples/, search/ as conjugate/_data/), and the installed package reads only
those. The wheel is built offline from a copy of the source tree, installed into a fresh virtual
environment (which sees this interpreter's installed dependencies, torch and triton included, but
not this checkout), and `conjugate search` runs with its defaults in a directory of its own, then
`conjugate export` and the exported reproduce.sh (with no environment activated). Every Python
process of that environment refuses to open a file of the checkout's package or shipped folders, so a
path that still leads into the checkout fails the test."""
from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
DATA_FOLDERS = PYPROJECT["tool"]["setuptools"]["package-dir"]  # conjugate._data.<folder> -> <folder>

# Installed into the fresh environment's site-packages: every process started there (the evaluation
# worker too) raises on opening or listing a path inside the checkout's code or shipped folders.
GUARD = '''import os, sys
_FORBIDDEN = tuple(os.path.join(p, "") for p in {forbidden!r})
def _guard(event, args):
    if event in ("open", "os.listdir", "os.scandir") and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if os.path.join(path, "").startswith(_FORBIDDEN):
            raise PermissionError(f"the installed package reached into the checkout: {{path}}")
sys.addaudithook(_guard)
'''

# Where the installed package is, and where conjugate.paths finds what it ships.
PROBE = """import json, conjugate, conjugate.paths as p
names = ("PLANS_DIR", "PLAN_SCHEMA_FILE", "PROFILES_DIR", "EXAMPLES_DIR", "DEFAULT_WORKLOAD", "PROMPTS_DIR",
         "PRICES_FILE")
files = [str(getattr(p, n)) for n in names] + [str(p.shipped_plan(n)) for n in p.SEED_PLANS]
print(json.dumps({"package": conjugate.__file__, "files": files}))
"""


def _run(argv: list, cwd: Path, env: dict | None = None, after: str = "") -> subprocess.CompletedProcess:
    """Runs a command to success; a failure shows its output (and `after`: what came before it)."""
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (f"{' '.join(map(str, argv))} exited {done.returncode}\n{done.stdout[-3000:]}\n"
                                  f"{done.stderr[-5000:]}" + (f"\n-- after:\n{after[-3000:]}" if after else ""))
    return done


def _source_copy(target: Path) -> Path:
    """What the wheel is built from: pyproject.toml, the readme, the package and its data folders
    (a copy, so the build writes nothing into the checkout and no stale build/ leaks into it)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    target.mkdir()
    shutil.copy2(REPO / "pyproject.toml", target)
    shutil.copy2(REPO / PYPROJECT["project"]["readme"], target)
    for folder in ("conjugate", *DATA_FOLDERS.values()):
        shutil.copytree(REPO / folder, target / folder, ignore=ignore)
    return target


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")}


def _environment(venv: Path, forbidden: list[str]) -> tuple[Path, dict]:
    """A fresh virtual environment seeing this interpreter's site-packages (plain path entries: their
    .pth files, an editable install's finder among them, are not run) and the checkout guard."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    outer = [p for p in (*site.getsitepackages(), site.getusersitepackages()) if Path(p).is_dir()]
    (purelib / "outer_site_packages.pth").write_text("".join(f"{p}\n" for p in outer))
    (purelib / "checkout_guard.py").write_text(GUARD.format(forbidden=forbidden))
    (purelib / "checkout_guard.pth").write_text("import checkout_guard\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["CONJUGATE_CACHE"] = str(venv.parent / "cache")
    return python, env


def test_wheel_installs_and_runs_from_anywhere(tmp_path):
    source = _source_copy(tmp_path / "source")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--disable-pip-version-check", "-q", "-w", tmp_path / "dist", source], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("conjugate-*.whl")

    # The wheel holds every module of the package and every file of the shipped folders.
    names = set(zipfile.ZipFile(wheel).namelist())
    code = {f"conjugate/{f}" for f in _files(source / "conjugate")}
    assert not code - names, f"modules missing from the wheel (list their package in pyproject.toml): {code - names}"
    data = {f"conjugate/_data/{folder}/{f}" for folder in DATA_FOLDERS.values() for f in _files(source / folder)}
    assert not data - names, f"shipped files missing from the wheel (pyproject.toml package-data): {data - names}"

    forbidden = [str(REPO / folder) for folder in ("conjugate", *DATA_FOLDERS.values())]
    python, env = _environment(tmp_path / "venv", forbidden)
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--no-cache-dir",
          "--disable-pip-version-check", "-q", wheel], cwd=tmp_path, env=env)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    # The installed code and its shipped files, not the checkout's.
    found = json.loads(_run([python, "-c", PROBE], cwd=elsewhere, env=env).stdout)
    package = Path(found["package"]).resolve().parent
    assert package.is_relative_to((tmp_path / "venv").resolve()) and REPO not in package.parents, package
    for path in found["files"]:
        assert Path(path).resolve().is_relative_to(package / "_data") and Path(path).exists(), path
    for folder in DATA_FOLDERS.values():
        for f in _files(source / folder):
            assert (package / "_data" / folder / f).read_bytes() == (source / folder / f).read_bytes(), f

    # The main job on its defaults: the run lands under the current directory.
    conjugate = python.parent / "conjugate"
    searched = _run([conjugate, "search", "--budget", "1"], cwd=elsewhere, env=env)
    db = elsewhere / "runs" / "tiny.db"
    assert db.is_file()
    named = _run([conjugate, "plan", "validate", "interleave", "--workload", "llama-1b-8b-b1"], cwd=elsewhere, env=env)
    assert "llama-1b-8b-b1" in named.stdout  # a shipped workload by its name

    # The export's reproduce.sh measures the plan again from any directory, on the installed files.
    _run([conjugate, "export", db, "--out", elsewhere / "export"], cwd=elsewhere, env=env, after=searched.stdout)
    script = elsewhere / "export" / "reproduce.sh"
    assert str(REPO) not in script.read_text() and str(package) not in script.read_text()
    _run(["bash", script], cwd=tmp_path, env={**env, "PATH": "/usr/bin:/bin"})  # no environment activated
    assert json.loads((elsewhere / "export" / "reproduced.json").read_text())["plans"]
