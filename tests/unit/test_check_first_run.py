"""`check`'s lines for what a new user meets first: the shipped MoE file in a fresh clone (no demo/ yet) said its
tokenizer and token files were missing without saying what makes them; a run reading a small corpus hundreds of
times said so only as a clause of its data line ('501.96 epochs')."""
import json
import shutil
from pathlib import Path

from data_helpers import write_tokens
from pretrain_cli import cli

REPO = Path(__file__).resolve().parents[2]


def test_a_fresh_clone_is_told_what_makes_demo(tmp_path, monkeypatch, capsys):
    """The shipped file's ./demo/tokenizer and ./demo/data, from a clone's root before scripts/quickstart.sh."""
    shutil.copytree(REPO / "configs" / "qwen3-moe-tiny", tmp_path / "configs" / "qwen3-moe-tiny")
    shutil.copy(REPO / "configs" / "qwen3-moe-tiny_cpu.json", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["check", "configs/qwen3-moe-tiny_cpu.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split(":")[1] for line in err] == [" tokenizer_name_or_path", " input_dir"], err
    for line, key in zip(err, ("tokenizer_name_or_path", "input_dir")):
        assert line.endswith(f"; ./demo/ is made by scripts/quickstart.sh (the README's first command): run it "
                             f"first, or set {key} to your own"), line
    # a path of one's own that is missing gets no word of the demo
    assert cli.main(["check", "configs/qwen3-moe-tiny_cpu.json", "--input_dir", "mine/data"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[1].startswith("error: input_dir: mine/data: no token files") and "quickstart" not in err[1], err


def _check(tmp_path, capsys, max_steps: int) -> list[str]:
    (tmp_path / "args.json").write_text(json.dumps({
        "model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data", n_docs=40, doc_len=64),
        "output_dir": str(tmp_path / "out"), "device": "cpu", "do_train": True, "max_steps": max_steps,
        "max_seq_length": 16, "split": "1", "per_device_train_batch_size": 4, "tokenizer_name_or_path": None}))
    assert cli.main(["check", str(tmp_path / "args.json")]) == 0
    return capsys.readouterr().out.splitlines()


def test_many_epochs_are_a_warning_saying_what_to_change(tmp_path, capsys):
    """40 documents of 64 tokens in 16-token samples (and the next one's label): 159 samples an epoch; 4 a step."""
    out = _check(tmp_path, capsys, 400)  # 1600 samples: 10.06 epochs
    warned = [line for line in out if line.startswith("warning: data: ")]
    assert warned == ["warning: data: the run reads data's train split 10.06 times (159 samples per epoch): past ~4 "
                      "epochs repeated tokens stop helping (Muennighoff et al. 2023, data-constrained scaling); give "
                      "input_dir more data, or lower max_steps (159 steps read it 4.00 times)"], out
    assert out[-1].startswith("check: OK")
    assert not [line for line in _check(tmp_path, capsys, 159) if line.startswith("warning: data:")]  # 4 epochs


def test_a_resumed_run_past_the_step_is_not_told_to_lower_max_steps_to_it(tmp_path, capsys):
    """A run resumed at step 200 was told 'lower max_steps (159 steps read it 4.00 times)': 159 is behind it."""
    from dataclasses import replace

    from pretrain_cli.commands.check import repetition_warning
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    _check(tmp_path, capsys, 400)
    spec = prepare(str(tmp_path / "args.json"), [], Target())
    past, before = (repetition_warning(replace(spec, resumed_at=at)) for at in ((200, 800), (100, 400)))
    assert len(past) == 1 and past[0].endswith("; give input_dir more data"), past
    assert before[0].endswith("or lower max_steps (159 steps read it 4.00 times)"), before
