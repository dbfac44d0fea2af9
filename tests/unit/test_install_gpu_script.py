"""scripts/install_gpu.sh with a stand-in interpreter (no network, no GPU): the pip commands it runs, in order,
with Paddle's index for the CUDA version asked for and the runtime dependencies pyproject.toml declares, and the
CUDA check that decides its exit code."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install_gpu.sh"

FAKE = f"""#!{sys.executable}
import json, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if args[:2] == ["-m", "venv"]:
    os.makedirs(os.path.join(args[2], "bin"))
    shutil.copy(sys.argv[0], os.path.join(args[2], "bin", "python"))
elif args[:2] == ["-m", "pip"]:
    sys.exit(0 if "show" not in args or os.environ.get("FAKE_CPU_PADDLE") else 1)
elif any("is_compiled_with_cuda()" in a for a in args):
    sys.exit(0 if os.environ.get("FAKE_CUDA") == "1" else 1)
else:
    sys.exit(3)
"""


def _runtime_deps() -> list[str]:
    block = re.search(r"^dependencies = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M).group(1)
    return [d for d in re.findall(r'"([^"]+)"', block) if not d.startswith("paddlepaddle")]


def _run(tmp_path, *args, **env):
    fake = tmp_path / "python"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    proc = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHON": str(fake), "VENV": str(tmp_path / "venv"),
                               "FAKE_LOG": str(log), **env})
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_installs_the_gpu_build_from_paddles_index_then_the_project(tmp_path):
    proc, calls = _run(tmp_path, "cu118", FAKE_CUDA="1")
    assert proc.returncode == 0, proc.stderr
    pip = ["-m", "pip", "--disable-pip-version-check"]
    assert calls == [
        ["-m", "venv", str(tmp_path / "venv")],
        [*pip, "show", "--quiet", "paddlepaddle"],
        [*pip, "install", "paddlepaddle-gpu==3.3.1", "-i", "https://www.paddlepaddle.org.cn/packages/stable/cu118/"],
        [*pip, "install", "--no-deps", "-e", "."],
        [*pip, "install", *_runtime_deps()],
        ["-W", "ignore", "-c", "import sys, paddle; sys.exit(0 if paddle.device.is_compiled_with_cuda() else 1)"],
    ]
    assert "numpy" in calls[4] and "visualdl" in calls[4]
    assert proc.stdout.strip().splitlines()[-1].split()[0] == "scripts/gpu_check.sh"


def test_replaces_the_cpu_build_and_fails_when_paddle_has_no_cuda(tmp_path):
    proc, calls = _run(tmp_path, FAKE_CPU_PADDLE="1", FAKE_CUDA="0")
    assert proc.returncode == 1 and "scripts/gpu_check.sh" not in proc.stdout
    assert ["-m", "pip", "--disable-pip-version-check", "uninstall", "--yes", "paddlepaddle"] in calls
    assert any("/cu126/" in " ".join(c) for c in calls)  # the default CUDA build
    assert proc.stderr.strip().splitlines()[-1].startswith("install_gpu: the Paddle in ")
    assert "is_compiled_with_cuda() is false" in proc.stderr


PUBLISHED = ("cu118", "cu126", "cu129")  # Paddle's index holds paddlepaddle-gpu 3.3.x for these (issue #60)


@pytest.mark.parametrize("cuda", ["cu999", "cu123"])  # cu123: Paddle's index has 3.0 pre-releases only
def test_a_cuda_version_paddle_does_not_publish_is_one_line_and_installs_nothing(tmp_path, cuda):
    proc, calls = _run(tmp_path, cuda)
    assert proc.returncode == 2 and calls == [] and not (tmp_path / "venv").exists()
    assert proc.stderr.strip().splitlines() == [
        f"install_gpu: Paddle publishes paddlepaddle-gpu==3.3.1 for cu118, cu126 and cu129, not '{cuda}'; "
        "usage: scripts/install_gpu.sh [cu118|cu126|cu129]"]


def test_the_script_and_the_readme_offer_exactly_the_published_variants(tmp_path):
    text = SCRIPT.read_text()
    offered = set(re.findall(r"\bcu\d{3}\b", text)) - {"cu123"}  # cu123 is named only as not offered
    assert offered == set(PUBLISHED)
    assert "cu123" not in re.search(r"^  cu[^)]*\)", text, re.M).group(0)
    readme = (ROOT / "README.md").read_text()
    assert set(re.findall(r"\bcu\d{3}\b", readme)) == set(PUBLISHED)
    proc, calls = _run(tmp_path, "cu129", FAKE_CUDA="1")
    assert proc.returncode == 0 and any("/cu129/" in " ".join(c) for c in calls)
