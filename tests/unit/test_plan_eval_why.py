"""What `plan`'s first suggestion and the fewest devices say of the eval keys `--fit` sets there, in `--fit`'s eval
line's words (`fit_report.eval_reasons`): the reason that held, the file's eval batch over the budget or not dividing
a data rank's samples, and eval_iters set so the layout's data ranks read the file's samples, with the growth of an
evaluation on more devices said. The first two tests fail on the code before (two wordings; 'to keep' where the
samples grew); the third failed on the code before that (a KeyError)."""
import dataclasses
import json
from pathlib import Path

from pretrain_cli.cli import main as cli_main
from pretrain_cli.planning.fit import fit_eval, with_eval
from pretrain_cli.planning.fit_report import _eval_line
from plan_helpers import plan

LLAMA3_8B = str(Path(__file__).resolve().parents[2] / "configs" / "llama-3-8b_pretrain.json")
QWEN2_72B = ["--model_name_or_path", "Qwen/Qwen2-72B"]


def test_an_eval_batch_over_the_budget_is_said_with_its_memory_as_fit_says_it(capsys):
    """Llama-3-8B at tp 1 + ZeRO-1 with per_device_eval_batch_size 16 on 2 A100-80GB: tp 2 holds 1 data rank, where
    an eval batch of 16 needs 84.65 GiB; --fit lowers it to 5 and eval_iters to 64 (320 samples kept). `plan`'s
    suggestion and `--fit`'s eval line say the same clauses (`fit_report.eval_reasons`): they were written twice
    and read differently ('to keep the 320 samples ... over 1' beside 'the file's 320 samples ... its 2 data
    ranks')."""
    over = ["--tensor_parallel_degree", "1", "--sharding", "stage1", "--recompute", "false",
            "--per_device_train_batch_size", "1", "--max_seq_length", "2048", "--per_device_eval_batch_size", "16"]
    first = plan(LLAMA3_8B, over, device="A100-80GB", gpus=2)["suggestions"][0]
    said = ("per_device_eval_batch_size 16 -> 5 (the file's 16 needs 84.65 GiB, over the 72.00 GiB budget) and "
            "eval_iters 10 -> 64 (the file's 320 samples an evaluation, 16 x 10 x its 2 data ranks, over the "
            "layout's 1 data rank)")
    assert first["why"].endswith(f"; --fit's eval keys there: {said}")
    assert "does not divide" not in first["why"]
    assert cli_main(["plan", LLAMA3_8B, *over, "--device", "A100-80GB", "--gpus", "2", "--fit"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("  eval per device")]
    assert line.endswith(f"70.16 GiB at per_device_eval_batch_size 5: {said}")


def test_more_devices_say_the_evaluation_grows_and_fit_o_writes_it(tmp_path, capsys):
    """Qwen2-72B from configs/llama-3-8b_pretrain.json on 2 A100-80GB: --gpus 24 with tp 8 leaves 3 data ranks where
    the file runs 12 there, so eval_iters 10 -> 40 reads its 240 samples an evaluation there (the eval loss stays
    comparable with the file's on 24); on the 2 devices asked for the file reads 20 (1 data rank), so the line says
    the evaluation grows with the data ranks, as the global batch does ('to keep the 240 samples' said it was kept),
    over the layout's 3 data ranks ('over 3'). `--gpus 24 --fit -o` writes that eval_iters, its line in the same
    words but for the growth (on 24 the file's own evaluation reads 240)."""
    first = plan(LLAMA3_8B, QWEN2_72B, device="A100-80GB", gpus=2)["suggestions"][0]
    assert first["gpus"] == 24 and first["change"]["eval_iters"] == 40
    assert "global batch 16 -> 48 samples (3 data ranks)" in first["why"]
    assert first["why"].endswith(
        "; --fit's eval keys there: eval_iters 10 -> 40 (the file's 240 samples an evaluation on 24 devices, 2 x 10 "
        "x its 12 data ranks, over the layout's 3 data ranks; an evaluation grows with the data ranks as the global "
        "batch does: 20 -> 240 samples)")
    out = str(tmp_path / "fitted.json")
    assert cli_main(["plan", LLAMA3_8B, *QWEN2_72B, "--device", "A100-80GB", "--gpus", "24", "--fit", "-o", out]) == 0
    written = json.loads(open(out).read())
    assert written["eval_iters"] == 40 and written["per_device_eval_batch_size"] == 2
    assert (": eval_iters 10 -> 40 (the file's 240 samples an evaluation, 2 x 10 x its 12 data ranks, over the "
            "layout's 3 data ranks)") in capsys.readouterr().out


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
    assert _eval_line(e, 72.0).endswith("at per_device_eval_batch_size 3: per_device_eval_batch_size 4 -> 3 (the "
                                        "file's 4 does not divide a data rank's 30 samples)")


def plan_of_a100():
    from pretrain_cli.orchestration import planned

    args, cfg = planned.parse(LLAMA3_8B, [])
    return planned.plan(args, cfg, "A100-80GB", 2, suggest_changes=False)
