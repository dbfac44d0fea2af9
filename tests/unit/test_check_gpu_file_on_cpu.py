"""`check` of a GPU argument file on a host without a GPU build (a login node) resolves it to this CPU, and refuses
it for this machine's memory as `train` would; when the user did not ask for a CPU run the line also says how to
ask the question they meant (`plan FILE --device H100`), and only then (`orchestration.host_fit.gpu_question`)."""
import json
from pathlib import Path

import pytest
from data_helpers import write_tokens

from pretrain_cli import runtime
from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning import hardware

LLAMA_8B = Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json"
DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo_cpu.json"
HINT = "--device H100` (or another of plan's --device names)"


@pytest.fixture
def login_node(monkeypatch):
    """No GPU build and a 23.5 GiB machine with 20 GiB available, whatever runs the suite."""
    monkeypatch.setattr(runtime, "gpu_build_installed", lambda: False)
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 23.5)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (20.0, "MemAvailable"))


def _memory_line(capsys) -> str:
    """The one refusal naming the model's memory (the shipped file's tokenizer and data are not here either)."""
    lines = [line for line in capsys.readouterr().err.splitlines() if "GiB" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_8b_file_without_device_is_refused_with_plans_question(login_node, capsys):
    assert "device" not in json.loads(LLAMA_8B.read_text())
    assert cli_main(["check", str(LLAMA_8B)]) == 2
    line = _memory_line(capsys)
    assert line.startswith("error: model_name_or_path: training llama with 8.03 B parameters on this CPU needs")
    assert "this machine has 23.5 GiB" in line
    assert "the file does not set device and this Paddle has no GPU build" in line
    assert f"`pretrain-cli plan {LLAMA_8B} {HINT}" in line
    # followed, the second hint checks the file as the GPU launch it is written for (tp 2: a multiple of 2)
    assert line.endswith(f"`pretrain-cli check {LLAMA_8B} --world_size N` (N: the GPUs, a multiple of 2)")
    cli_main(["check", str(LLAMA_8B), "--world_size", "8"])
    assert not [x for x in capsys.readouterr().err.splitlines() if "GiB" in x]


def test_asked_for_gpu_on_the_command_line_says_so(login_node, capsys):
    assert cli_main(["check", str(LLAMA_8B), "--device", "gpu"]) == 2
    line = _memory_line(capsys)
    assert "the command line asks for device gpu and this Paddle has no GPU build" in line and HINT in line


def test_asked_for_cpu_no_gpu_question(login_node, capsys):
    assert cli_main(["check", str(LLAMA_8B), "--device", "cpu"]) == 2
    line = _memory_line(capsys)
    assert "this machine has 23.5 GiB" in line and "--device H100" not in line and "GPU build" not in line


@pytest.fixture
def demo(tmp_path):
    """The README's CPU demo on a small token file, without its tokenizer; `device` as each test writes it."""
    cfg = json.loads(DEMO.read_text())
    cfg.pop("tokenizer_name_or_path")
    cfg.update(input_dir=write_tokens(tmp_path / "data", vocab_size=2048), output_dir=str(tmp_path / "out"),
               split="100,0,0", do_eval=False, do_predict=False, per_device_train_batch_size=100000)
    return cfg


@pytest.mark.parametrize("device", [None, "cpu"])
def test_the_whole_plans_refusal_asks_the_gpu_question_only_without_device_cpu(demo, tmp_path, login_node, capsys,
                                                                                  device):
    """The parameters fit (a small model); its activations at 100,000 sequences do not (`host_fit.check`)."""
    if device is None:
        demo.pop("device")
    else:
        demo["device"] = device
    path = tmp_path / "run.json"
    path.write_text(json.dumps(demo))
    assert cli_main(["check", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: per_device_train_batch_size: this CPU run is planned to need ")
    assert (f"`pretrain-cli plan {path} {HINT}" in err[0]) == (device is None)
    assert ("the file does not set device" in err[0]) == (device is None)
