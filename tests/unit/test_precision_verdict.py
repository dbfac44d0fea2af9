"""One verdict on precision for `eval` (a run's split through `--model RUN` or `--config RUN/args.json`, `--data`'s
windows) and `generate`: what the user typed for this command, a hand-written `--config` file included, is refused as
`train` refuses it; what a run recorded and this device cannot do runs, with a note saying what computes instead."""
import json

import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli.orchestration import recorded, targets  # noqa: E402
from pretrain_cli.run_config import Target  # noqa: E402
from pretrain_cli.training import weight_source  # noqa: E402
from test_inference_kernels import _fp16_run  # noqa: E402

T4 = Target(device="gpu", gpu_name="Tesla T4", gpu_capability=(7, 5))
NO_BF16 = ("Tesla T4 has no bf16 tensor cores (compute capability 7.5; bf16 came with Ampere, 8.0: A10, A100, L4, "
           "H100)")


def _on_a_t4(monkeypatch) -> list:
    """A T4 as the device `eval` and `generate` run on; the model built for it is loaded on this CPU with the default
    kernels, and what was asked for it ((kernels, device)) is kept in the list returned."""
    asked, load = [], weight_source.load_for_inference
    monkeypatch.setattr(targets, "inference_target", lambda: T4)
    monkeypatch.setattr(weight_source, "load_for_inference",
                        lambda model_dir, cfg, seed, request=None, device=None:
                        asked.append((request, device)) or load(model_dir, cfg, seed))
    return asked


def _paths(model: str, config: str, data: str) -> list[tuple[str, list[str]]]:
    """(command, argv) of every path that judges a run's precision: a run's split through its directory and through
    its record, --data's windows, and generate."""
    return [("eval", ["eval", "--model", model]), ("eval", ["eval", "--config", config]),
            ("eval", ["eval", "--model", model, "--data", data]),
            ("generate", ["generate", "--model", model, "--prompt", "hello", "--max_new_tokens", "2"])]


def test_a_runs_recorded_bf16_this_gpu_lacks_runs_with_one_note_on_every_path(tmp_path, capsys, monkeypatch):
    """A run trained in bf16 (on an A100), on a T4: `eval --model RUN` and `eval --config RUN/args.json` (a run's split,
    prepared as train prepares it) were refused with train's line ("set bf16: false ..." in a file the user did not
    write), where `--data` and `generate` ran with a note. Every path runs, says the same note, and asks for the same
    kernels on the GPU; what an override adds (`--fp16 true`: both true) is refused on every path in the same line."""
    from pretrain_cli.cli import main as cli_main

    asked = _on_a_t4(monkeypatch)
    model, _, arguments = _fp16_run(tmp_path, "bf16")
    record = str(tmp_path / "m" / "args.json")
    kernels = []
    for command, argv in _paths(model, record, arguments["input_dir"]):
        asked.clear()
        code, err = cli_main([*argv, "--json"]), capsys.readouterr().err
        assert code == 0, (argv, err)
        assert [n for n in err.splitlines() if "bf16" in n] == [
            f"note: bf16 (in {record}): {NO_BF16}; {command} computes in fp32, as Paddle's AMP would here (train would "
            f"refuse bf16 on this GPU)"], (argv, err)
        (request, device), = asked
        kernels.append((request.attention, device))
    assert kernels == [("math", "gpu")] * 4  # (pre-Ampere: no flash-attn-2, whatever the precision)
    for _, argv in _paths(model, record, arguments["input_dir"]):
        code, err = cli_main([*argv, "--fp16", "true"]), capsys.readouterr().err
        assert code == 2 and err.strip().splitlines() == [
            f"error: fp16, bf16: both are true (bf16 in {record}, --fp16 on the command line); choose one precision: "
            f"pass --bf16 false --fp16 true"], (argv, err)


def _hand_written(tmp_path, arguments: dict, **precision) -> str:
    """An argument file the user wrote (no run's record): the run's arguments with `precision`."""
    path = tmp_path / "hand.json"
    path.write_text(json.dumps({**arguments, "fp16": False, **precision}))
    return str(path)


def test_a_hand_written_files_precision_is_refused_as_train_refuses_it_on_every_path(tmp_path, capsys, monkeypatch):
    """A file the user wrote that sets fp16 and bf16 ran with a note on `--data`'s windows, and was refused on its own
    split (through `prepare`): it is the user's input, refused on both with train's line naming the file. On a T4, its
    bf16 likewise (it was a note on `--data`); with `--bf16 false` typed both paths run, silently."""
    from pretrain_cli.cli import main as cli_main

    _, _, arguments = _fp16_run(tmp_path, None)
    both = _hand_written(tmp_path, arguments, fp16=True, bf16=True)
    for argv in (["--config", both], ["--config", both, "--data", arguments["input_dir"]]):
        code, err = cli_main(["eval", *argv]), capsys.readouterr().err
        assert code == 2 and err.strip().splitlines() == [
            f"error: fp16, bf16: both are true (both in {both}); choose one precision: set one of them false there"], err
    _on_a_t4(monkeypatch)
    bf16 = _hand_written(tmp_path, arguments, bf16=True)
    for argv in (["--config", bf16], ["--config", bf16, "--data", arguments["input_dir"]]):
        code, err = cli_main(["eval", *argv]), capsys.readouterr().err
        assert code == 2 and err.strip().splitlines() == [
            f"error: bf16: {NO_BF16}, and Paddle's AMP would silently run fp32; set bf16: false and fp16: true "
            f"(loss-scaled fp16), or bf16: false alone for fp32"], err
        code, err = cli_main(["eval", *argv, "--bf16", "false", "--json"]), capsys.readouterr().err
        assert code == 0 and "bf16" not in err, err


def test_one_judge_gives_every_paths_verdict(tmp_path, capsys, monkeypatch):
    """`recorded.precision_verdict` decides for `prepare`'s eval path and for `idle_kernel_keys` (--data, generate): on
    a T4 the run's bf16 reaches it on each of the four paths, and each note is the one it returned."""
    from pretrain_cli.cli import main as cli_main

    _on_a_t4(monkeypatch)
    model, _, arguments = _fp16_run(tmp_path, "bf16")
    verdicts, judge = [], recorded.precision_verdict

    def judged(*args, **kwargs):
        verdicts.append(judge(*args, **kwargs))
        return verdicts[-1]

    monkeypatch.setattr(recorded, "precision_verdict", judged)
    for command, argv in _paths(model, str(tmp_path / "m" / "args.json"), arguments["input_dir"]):
        verdicts.clear()
        code, err = cli_main(argv), capsys.readouterr().err
        assert code == 0 and verdicts, (argv, err)
        assert all(refused == [] for refused, _ in verdicts)
        assert {n for _, notes in verdicts for n in notes} == {n for n in err.splitlines() if "bf16" in n}, err


@pytest.mark.parametrize("typed", [[], ["--bf16", "true"]])
def test_a_restated_or_recorded_precision_is_no_refusal_of_a_runs_split(tmp_path, capsys, monkeypatch, typed):
    """`eval --model RUN --bf16 true` restates the run's bf16 (no change): noted on the run's split as on --data."""
    from pretrain_cli.cli import main as cli_main

    _on_a_t4(monkeypatch)
    model, _, arguments = _fp16_run(tmp_path, "bf16")
    errs = []
    for argv in (["eval", "--model", model], ["eval", "--model", model, "--data", arguments["input_dir"]]):
        code, err = cli_main([*argv, *typed]), capsys.readouterr().err
        assert code == 0, err
        errs.append([n for n in err.splitlines() if "bf16" in n])
    assert errs[0] == errs[1] and len(errs[0]) == 1
