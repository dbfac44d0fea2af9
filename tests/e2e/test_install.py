"""A normal (non-editable) install works away from the repository: presets and kernel sources ship in the wheel.

The wheel is built from this checkout and installed with `--no-deps` into a fresh virtual environment;
its third-party dependencies come from the test environment's site-packages through a plain path entry
(a `.pth` line, so that environment's own `.pth` files, including the editable install of this
checkout, are not processed). `check` and `plan` then run from a directory outside the repository.
"""
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

from pretrain_cli.ops import cpu_build

REPO = Path(__file__).resolve().parents[2]


def _run(cmd, cwd, timeout=300):
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                       env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert p.returncode == 0, f"{cmd}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


def test_wheel_installed_elsewhere_has_presets_and_kernel_sources(tmp_path):
    build = tmp_path / "build"
    shutil.copytree(REPO, build, ignore=shutil.ignore_patterns(".venv", ".git", "demo", "output", "*.egg-info",
                                                               "__pycache__", "build", "dist"))
    _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path / "wheels"],
         cwd=build)
    wheel = next((tmp_path / "wheels").glob("pretrain_cli-*.whl"))
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "-q", wheel], cwd=tmp_path)
    fresh_site = Path(_run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           cwd=tmp_path).stdout.strip())
    (fresh_site / "test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")

    work = tmp_path / "elsewhere"
    shutil.copytree(REPO / "data" / "tiny", work / "tiny")
    (work / "run.json").write_text(json.dumps({
        "model_name_or_path": "tiny-qwen2", "tokenizer_name_or_path": "tiny/tokenizer", "input_dir": "tiny",
        "output_dir": "out", "device": "cpu", "split": "90,5,5", "max_seq_length": 64, "max_steps": 5,
        "do_train": True}))
    where = _run([py, "-c", "import pretrain_cli, pathlib; print(pathlib.Path(pretrain_cli.__file__).resolve())"],
                 cwd=work).stdout.strip()
    assert where.startswith(str(fresh_site.resolve())), where  # the installed copy, not this checkout
    installed = Path(where).parent
    assert (installed / "config" / "presets" / "tiny-qwen2" / "config.json").is_file()
    csrc = {p.name for p in (installed / "ops" / "csrc").iterdir()}
    assert {*cpu_build.SOURCES, *(h.name for h in cpu_build.headers())} <= csrc
    assert {"common.h", "causal_tiles.h", "norm_rows.h"} <= {h.name for h in cpu_build.headers()}
    check = _run([venv / "bin" / "pretrain-cli", "check", "run.json"], cwd=work)
    assert "check: OK" in check.stdout and "tiny-qwen2" in check.stdout
    plan = _run([venv / "bin" / "pretrain-cli", "plan", "run.json", "--device", "A100-80GB", "--json"], cwd=work)
    assert json.loads(plan.stdout)["model"]["model_type"] == "qwen2"
    alias = _run([venv / "bin" / "pretrain-cli", "plan", "run.json", "--model_name_or_path", "Qwen/Qwen2.5-0.5B",
                  "--json"], cwd=work)
    assert json.loads(alias.stdout)["params"]["total"] == 494_032_768
