"""The wheel ships the application only: every package folder of the source tree, the CPU kernels' library it
builds from common/kernels/cpu, and the embedded default model, nothing else (no tests, training, bench, scripts,
examples or C++ sources). Installed into a fresh virtual environment, its ``omnijax`` program and its Python API
answer on the default model exactly as the editable install does, with the wheel's own kernels, from a folder whose
own ``app.py`` and ``common.py`` would clash with top-level packages of those names."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from fixtures.child_path import WITHOUT_TORCH

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
IMAGE = ROOT / "examples" / "shapes.png"
PROMPT = "Describe this image."
# Each source folder and the package it installs as.
PACKAGE_FOLDERS = {"omnijax": "omnijax", "common": "omnijax/common", "preprocess": "omnijax/preprocess",
                   "encoders": "omnijax/encoders", "decoder": "omnijax/decoder", "app": "omnijax/app",
                   "demo": "omnijax/demo"}
CHECKPOINT = pathlib.Path("app") / "checkpoints" / "shapes-gemma3"
# (and no library an editable install built in place: the wheel builds its own)
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "*.so")
KERNELS = f"omnijax/common/kernels/_cpu_kernels{sysconfig.get_config_var('EXT_SUFFIX')}"
TIMEOUT = 600

# The same lines run in both environments: where omnijax and the default model come from, and the answer.
API_SCRIPT = r"""
import json, sys
import omnijax
from omnijax import Pipeline
from omnijax.app.default_model import default_model_dir
from omnijax.common.kernels import native_library

image, prompt = sys.argv[1:3]
pipe = Pipeline.from_pretrained(default_model_dir())
result = pipe.generate([{"role": "user", "content": [{"type": "image", "image": image},
                                                     {"type": "text", "text": prompt}]}])
files = sorted({m.__file__ for name, m in sys.modules.items()
                if name.split(".")[0] == "omnijax" and getattr(m, "__file__", None)})
print("RESULT" + json.dumps({"files": files, "model": str(default_model_dir()), "text": result.text,
                             "kernels": str(native_library.library_path()), "isa": native_library.best_isa(),
                             "clashes": [n for n in ("app", "common") if n in sys.modules]}))
"""

CLASH = 'raise RuntimeError("the working folder\'s own {name}.py was imported")\n'


def expected_wheel_files() -> set[str]:
    """Every file the wheel must hold (besides its .dist-info): the modules of every source folder that has an
    __init__.py, under its installed name, the CPU kernels' library and the default checkpoint's files."""
    files = set()
    for folder, installed in PACKAGE_FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            package = init.parent
            if "__pycache__" in package.parts:
                continue
            rel = package.relative_to(ROOT / folder).as_posix()
            prefix = installed if rel == "." else f"{installed}/{rel}"
            files |= {f"{prefix}/{module.name}" for module in package.glob("*.py")}
    files |= {f"{PACKAGE_FOLDERS['app']}/{p.relative_to(ROOT / 'app').as_posix()}"
              for p in (ROOT / CHECKPOINT).iterdir()}
    return files | {KERNELS}


def _start(cmd, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **kwargs)


def _outcome(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    """Wait for ``proc`` to end (killed past the timeout) and collect its output."""
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _ok(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, (done.args, done.stdout[-3000:], done.stderr[-3000:])
    return done


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    return _ok(_outcome(_start(cmd, **kwargs)))


def _env(home: pathlib.Path) -> dict:
    """A user's environment: CPU, its own OMNIJAX_HOME, no torch (tests/conftest.py), nothing else on
    PYTHONPATH."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", OMNIJAX_HOME=str(home), PYTHONPATH=str(WITHOUT_TORCH))
    for name in ("PYTHONHOME", "OMNIJAX_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "OMNIJAX_TEST_TORCH"):
        env.pop(name, None)
    return env


def _api_run(python, cwd: pathlib.Path, env: dict) -> subprocess.Popen:
    return _start([python, "-c", API_SCRIPT, IMAGE, PROMPT], cwd=cwd, env=env)


def _api_result(done: subprocess.CompletedProcess) -> dict:
    lines = _ok(done).stdout.splitlines()
    return json.loads(next(line for line in lines if line.startswith("RESULT"))[len("RESULT"):])


def _dependency_paths() -> list[str]:
    """The test environment's site-packages folders (where the dependencies are)."""
    return [p for p in sys.path if pathlib.Path(p).name in ("site-packages", "dist-packages") and os.path.isdir(p)]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """The wheel built from a copy of the source tree (so no build folder is left in, or reused from, the tree)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    build = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                  "--no-cache-dir", "--disable-pip-version-check", "-v", "-w", work / "dist", source], cwd=work)
    log = build.stdout + build.stderr
    assert "BuildBackendWarning" not in log, log[-6000:]  # e.g. a data folder importable but not a listed package
    (built,) = (work / "dist").glob("omnijax-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> pathlib.Path:
    """A fresh virtual environment with the wheel installed; the test environment's site-packages folders are
    path lines of a .pth file (for the dependencies), whose own .pth files (the editable install's) do not run."""
    folder = tmp_path_factory.mktemp("venv") / "env"
    _run([sys.executable, "-m", "venv", "--without-pip", folder])
    python = folder / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--no-cache-dir", "--disable-pip-version-check", wheel])
    site = _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()
    (pathlib.Path(site) / "test_dependencies.pth").write_text("".join(p + "\n" for p in _dependency_paths()))
    return folder


@pytest.fixture(scope="module")
def clashing_folder(tmp_path_factory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("user")
    for name in ("app", "common"):
        (folder / f"{name}.py").write_text(CLASH.format(name=name))
    return folder


def test_wheel_holds_the_packages_and_the_default_model_only(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    info = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    assert {n.split("/")[0] for n in info} == {"-".join(wheel.name.split("-")[:2]) + ".dist-info"}
    expected = expected_wheel_files()
    assert {"omnijax/__init__.py", "omnijax/app/pipeline.py", "omnijax/app/checkpoints/shapes-gemma3/config.json",
            "omnijax/app/checkpoints/shapes-gemma3/model.safetensors"} <= expected
    assert sorted(set(names) - info) == sorted(expected)


def test_installed_wheel_answers_as_the_editable_install(venv, clashing_folder, tmp_path):
    """The editable install answers first (it fills the shared compilation cache); then the installed wheel's
    Python API and its ``omnijax`` program, side by side."""
    env = _env(tmp_path / "home")
    reference = _api_result(_outcome(_api_run(sys.executable, tmp_path, env)))
    # the editable install (the test environment) imports from the source tree
    assert reference["files"] and all(pathlib.Path(f).is_relative_to(ROOT) for f in reference["files"])
    assert pathlib.Path(reference["model"]) == ROOT / CHECKPOINT
    assert reference["text"].strip()

    api = _api_run(venv / "bin" / "python", clashing_folder, env)
    cli = _start([venv / "bin" / "omnijax", "generate", "--image", IMAGE, "--prompt", PROMPT], cwd=clashing_folder,
                 env=env)
    api, cli = _outcome(api), _outcome(cli)  # both end before either is checked
    installed = _api_result(api)
    _ok(cli)

    site = venv / "lib"
    assert installed["clashes"] == []
    assert installed["files"] and all(pathlib.Path(f).is_relative_to(site) for f in installed["files"])
    assert pathlib.Path(installed["model"]).is_relative_to(site)
    # the wheel's own kernels, on the instruction set the editable install's take
    assert pathlib.Path(installed["kernels"]).is_relative_to(site) and installed["kernels"].endswith(KERNELS)
    assert installed["isa"] is not None and installed["isa"] == reference["isa"]
    assert installed["text"] == reference["text"]
    assert f"embedded default model at {installed['model']}" in cli.stderr
    assert cli.stdout == reference["text"] + "\n"
