"""What `plan`'s first suggestion and the fewest devices say of the eval keys `--fit` sets there (`fit.eval_why`):
the reason that held, the file's eval batch over the budget or not dividing a data rank's samples, and eval_iters
keeping the samples an evaluation reads where the data ranks shrink. One generic sentence named both reasons and no
numbers (each test failed on that code)."""
import dataclasses
import json
from pathlib import Path

from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning.fit import fit_eval, with_eval
from pretrain_cli.planning.fit_report import _eval_line
from plan_helpers import plan

LLAMA3_8B = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json")
QWEN2_72B = ["--model_name_or_path", "Qwen/Qwen2-72B"]


def test_an_eval_batch_over_the_budget_is_said_with_its_memory():
    """Llama-3-8B at tp 1 + ZeRO-1 with per_device_eval_batch_size 16 on 2 A100-80GB: tp 2 holds 1 data rank, where
    an eval batch of 16 needs 84.65 GiB; --fit lowers it to 5 and eval_iters to 64 (320 samples kept)."""
    over = ["--tensor_parallel_degree", "1", "--sharding", "stage1", "--recompute", "false",
            "--per_device_train_batch_size", "1", "--max_seq_length", "2048", "--per_device_eval_batch_size", "16"]
    first = plan(LLAMA3_8B, over, device="A100-80GB", gpus=2)["suggestions"][0]
    assert first["why"].endswith(
        "; --fit's eval keys there: per_device_eval_batch_size 16 -> 5 (the file's 16 needs 84.65 GiB, over the "
        "72.00 GiB budget) and eval_iters 10 -> 64 (to keep the 320 samples an evaluation reads as written on 2 "
        "devices, 16 x 10 x 2 data ranks, over 1)")
    assert "does not divide" not in first["why"]


def test_more_devices_say_eval_iters_keeps_the_files_samples_and_fit_o_writes_it(tmp_path, capsys):
    """Qwen2-72B from configs/llama-3-8b_pretrain.json on 2 A100-80GB: --gpus 24 with tp 8 leaves 3 data ranks where
    the file runs 12 there, so eval_iters 10 -> 40 keeps its 240 samples an evaluation (the eval loss stays
    comparable); the line says so, and `--gpus 24 --fit -o` writes that eval_iters."""
    first = plan(LLAMA3_8B, QWEN2_72B, device="A100-80GB", gpus=2)["suggestions"][0]
    assert first["gpus"] == 24 and first["change"]["eval_iters"] == 40
    assert first["why"].endswith("; --fit's eval keys there: eval_iters 10 -> 40 (to keep the 240 samples an "
                                 "evaluation reads as written on 24 devices, 2 x 10 x 12 data ranks, over 3)")
    out = str(tmp_path / "fitted.json")
    assert cli_main(["plan", LLAMA3_8B, *QWEN2_72B, "--device", "A100-80GB", "--gpus", "24", "--fit", "-o", out]) == 0
    written = json.loads(open(out).read())
    assert written["eval_iters"] == 40 and written["per_device_eval_batch_size"] == 2
    assert "(eval_iters 10 -> 40: the file's 240 samples an evaluation, 2 x 10 x its 12 data ranks)" in \
        capsys.readouterr().out


def test_an_eval_batch_that_does_not_divide_is_said_so_and_the_fit_line_prints():
    """4 samples x 10 iterations x 3 data ranks as written, 4 data ranks in the layout: 30 samples a rank, which 4
    does not divide; 3 does in the same 10 iterations, so eval_iters stays. The --fit line read the eval_iters the
    change did not carry (KeyError)."""
    base = plan_of_a100()
    r = dataclasses.replace(base, eval_batch=4, eval_memory_gib=1.0,
                            parallel=dataclasses.replace(base.parallel, data_ranks=4))
    current = {"eval_iters": 10, "do_eval": True, "per_device_eval_batch_size": 4}

    def replan(change):
        return dataclasses.replace(r, eval_batch=change["per_device_eval_batch_size"])

    change, why = with_eval(current, {"tensor_parallel_degree": 2}, r, replan, 72.0, 3)
    assert change == {"tensor_parallel_degree": 2, "per_device_eval_batch_size": 3}
    assert why == ("; --fit's eval keys there: per_device_eval_batch_size 4 -> 3 (the file's 4 does not divide a data "
                   "rank's 30 samples)")
    e = fit_eval(current, {"change": {}, "report": r}, replan, 72.0, 3)
    assert _eval_line(e, 72.0).endswith("at per_device_eval_batch_size 3, as the file's 4 does not divide a data "
                                        "rank's 30 samples")


def plan_of_a100():
    from pretrain_cli.orchestration import planned

    args, cfg = planned.parse(LLAMA3_8B, [])
    return planned.plan(args, cfg, "A100-80GB", 2, suggest_changes=False)
