"""`plan --fit`: the fastest layout that fits, each candidate re-resolved by `train`'s rules, and the fitted file."""
import json
from pathlib import Path

import pytest

from pretrain_cli.cli import main as cli_main
from plan_helpers import fit, plan
from pretrain_cli.errors import UserError
from pretrain_cli.planning import fit as fit_search
from pretrain_cli.planning import fit_candidates
from pretrain_cli.planning import hardware

QWEN = Path(__file__).resolve().parents[1] / "e2e" / "paddlenlp_configs" / "qwen_pretrain_argument_0p5b.json"
AT_4096 = ["--max_seq_length", "4096"]
UNFUSED = ["--use_fused_linear_cross_entropy", "false"]


def _plan(overrides: list[str], device: str, gpus: int = 1):
    """The `Plan` the search ranks (`plan` returns its JSON)."""
    from pretrain_cli.orchestration.planned import parse as parsed
    from pretrain_cli.orchestration import planned

    return planned.plan(*parsed(str(QWEN), overrides), device, gpus, suggest_changes=False)


def _tokens(change: dict) -> list[str]:
    return [tok for k, v in change.items() for tok in (f"--{k}", json.dumps(v) if isinstance(v, bool) else str(v))]


def test_fitted_layout_fits_keeps_the_global_batch_and_is_what_plan_predicts():
    f = fit(str(QWEN), AT_4096, device="V100-16GB", gpus=8)
    assert f["before"]["memory_gib"] > 16 and f["after"] is not None
    assert f["budget_gib"] == pytest.approx(16 * 0.9) and f["after"]["memory_gib"] <= f["budget_gib"]
    again = plan(str(QWEN), AT_4096 + _tokens(f["change"]), device="V100-16GB", gpus=8, suggest_changes=False)
    assert again["memory_gib"] == pytest.approx(f["after"]["memory_gib"])
    assert again["tokens_per_step"] // 4096 == f["global_batch"] == 8  # micro x acc x data ranks unchanged
    assert again["parallel"]["tp"] in (1, 2)  # 14 heads and 2 KV heads: tp 4 and 8 are refused by resolve
    assert [k for k, _, _ in f["diff"]] and all(old != new for _, old, new in f["diff"])
    assert f["tried"] > f["valid"] > 1
    # docs/PLAN.md's worked example: ZeRO-2 runs the fused head + loss, so the file keeps its stage2
    assert f["diff"] == [("recompute", False, True), ("recompute_granularity", "full", "core_attn")]


def test_no_fitting_candidate_is_faster_than_the_chosen_one():
    f = fit(str(QWEN), AT_4096, device="V100-16GB", gpus=8)
    base = plan(str(QWEN), AT_4096, device="V100-16GB", gpus=8, suggest_changes=False)
    current = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "recompute": False,
               "recompute_granularity": "full", "use_flash_attention": False, "sharding": "stage2",
               "tensor_parallel_degree": 1}
    best = f["after"]["speed"]["step_seconds"]
    faster_fitting = []
    for change in fit_candidates.candidates(current, 8, 8):
        try:
            r = _plan(AT_4096 + _tokens(change), "V100-16GB", 8)
        except UserError:
            continue
        if r.peak_gib <= f["budget_gib"] and fit_search.speed(r)["step_seconds"] < best * (1 - 1e-9):
            faster_fitting.append(change)
    assert not faster_fitting
    assert base["memory_gib"] > f["budget_gib"]


def test_a_file_that_fits_keeps_its_layout_unless_something_is_faster(tmp_path):
    cfg = tmp_path / "small.json"
    cfg.write_text(json.dumps({"model_name_or_path": "tiny-llama", "output_dir": "o", "input_dir": "d", "max_steps": 10,
                               "do_train": True, "bf16": True, "per_device_train_batch_size": 4,
                               "use_flash_attention": True, "max_seq_length": 512}))
    f = fit(str(cfg), [], device="A100-80GB", gpus=1)
    assert f["diff"] == [] and f["after"]["memory_gib"] == pytest.approx(f["before"]["memory_gib"])
    # recompute on: dropping it is faster and still fits, so the fit turns it off
    f = fit(str(cfg), ["--recompute", "true"], device="A100-80GB", gpus=1)
    assert ("recompute", True, False) in f["diff"]
    assert f["after"]["speed"]["tokens_per_sec"] > f["before"]["speed"]["tokens_per_sec"]


def test_nothing_fits_names_what_the_smallest_layout_needs(capsys):
    # the fused head + loss (our default) makes it fit one card with recompute; unfused (PaddleNLP's way) it does not
    assert cli_main(["plan", str(QWEN), *AT_4096, "--device", "V100-16GB", "--fit"]) == 0
    assert "recompute: false -> true" in capsys.readouterr().out
    assert cli_main(["plan", str(QWEN), *AT_4096, *UNFUSED, "--device", "V100-16GB", "--fit"]) == 1
    text = capsys.readouterr().out
    assert "nothing fits: the current layout needs" in text
    assert "the smallest layout (recompute true) needs" in text and "a device with at least" in text
    assert "or more devices: --gpus 2" in text
    f = fit(str(QWEN), AT_4096 + UNFUSED, device="V100-16GB", gpus=1)
    assert f["after"] is None and f["smallest"]["memory_gib"] > f["budget_gib"]
    assert f["more_devices"]["memory_gib"] <= f["budget_gib"]


def test_output_file_is_the_users_file_with_the_changed_keys(tmp_path, capsys):
    out = tmp_path / "fitted.json"
    assert cli_main(["plan", str(QWEN), *AT_4096, "--device", "V100-16GB", "--gpus", "8", "--fit", "-o",
                     str(out)]) == 0
    text = capsys.readouterr().out
    assert "changes (old -> new):" in text and "predicted speed:" in text and f"wrote {out}" in text
    original, fitted = json.loads(QWEN.read_text()), json.loads(out.read_text())
    assert list(fitted)[:len(original)] == list(original)  # same keys, same order, same names
    changed = {k for k in fitted if fitted[k] != original.get(k)}
    f = fit(str(QWEN), AT_4096, device="V100-16GB", gpus=8)
    # the fit, the command-line override, and a directory of its own (the source's run is left alone)
    assert changed == {k for k, _, _ in f["diff"]} | {"max_seq_length", "output_dir"}
    assert fitted["output_dir"] == original["output_dir"].rstrip("/") + "-fitted" and f"{fitted['output_dir']}" in text
    again = plan(str(out), [], device="V100-16GB", gpus=8, suggest_changes=False)
    assert again["memory_gib"] == pytest.approx(f["after"]["memory_gib"]) and again["max_seq_length"] == 4096
    assert not list(tmp_path.glob("*.tmp*"))
    assert cli_main(["plan", str(QWEN), *AT_4096, "--device", "V100-16GB", "--gpus", "8", "--fit", "-o",
                     str(out)]) == 0  # the same command again replaces the fitted file it wrote
    assert json.loads(out.read_text()) == fitted and f"wrote {out}" in capsys.readouterr().out


@pytest.mark.parametrize("target,fragment", [
    ("data", "-o {d}/data: is a directory; give the fitted file's path, e.g. -o {d}/data/fitted.json"),
    ("notes.txt", "-o {d}/notes.txt: exists and is not a fitted argument file `plan --fit -o` wrote; choose another "
                  "path, or remove it"),
    ("cfg.json", "-o {d}/cfg.json: is the argument file being fitted; write the fitted file to another path"),
    ("missing/f.json", "-o {d}/missing/f.json: {d}/missing is not an existing directory; create it or write the file "
                       "elsewhere"),
])
def test_an_output_that_must_not_be_replaced_is_one_line_exit_2_before_the_search(tmp_path, capsys, target, fragment):
    """Not `data.tmp6699 -> data: Is a directory` (exit 1, naming the temporary), nor a silently overwritten file."""
    (tmp_path / "data").mkdir()
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "cfg.json").write_text(QWEN.read_text())
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert cli_main(["plan", str(tmp_path / "cfg.json"), "--device", "A100-80GB", "--fit", "-o",
                     str(tmp_path / target)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["error: " + fragment.format(d=tmp_path)] and captured.out == ""
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.json", "data", "notes.txt"]


def test_a_fitted_file_resumes_the_source_runs_checkpoint_and_considers_sequence_parallel(tmp_path, capsys):
    """A run that ran out of memory left checkpoint-3: the fitted file (its own output_dir) resumes from it by
    name. With tensor parallelism the search tries sequence parallelism too (its own layout)."""
    (tmp_path / "run" / "checkpoint-3").mkdir(parents=True)
    out = tmp_path / "fitted.json"
    assert cli_main(["plan", str(QWEN), *AT_4096, "--output_dir", str(tmp_path / "run"), "--device", "V100-16GB",
                     "--gpus", "8", "--fit", "-o", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert fitted["output_dir"] == f"{tmp_path / 'run'}-fitted"
    assert fitted["resume_from_checkpoint"] == str(tmp_path / "run" / "checkpoint-3")
    assert f"resuming from {tmp_path / 'run' / 'checkpoint-3'}" in capsys.readouterr().out
    from pretrain_cli.planning.fit_candidates import candidates

    current = {"use_flash_attention": True, "sharding": "", "tensor_parallel_degree": 1, "sequence_parallel": False}
    tried = candidates(current, 16, 8)
    assert any(c.get("tensor_parallel_degree") == 2 and c.get("sequence_parallel") for c in tried)
    assert not any(c.get("sequence_parallel") for c in tried if c.get("tensor_parallel_degree", 1) == 1)


def test_margin_flag_and_errors(capsys):
    loose = fit(str(QWEN), AT_4096, device="V100-16GB", gpus=8, margin=0.0)
    tight = fit(str(QWEN), AT_4096, device="V100-16GB", gpus=8, margin=0.5)
    assert loose["budget_gib"] == 16 and tight["budget_gib"] == 8
    assert tight["after"] is None or tight["after"]["memory_gib"] <= 8
    assert loose["after"]["speed"]["tokens_per_sec"] >= (tight["after"] or loose["after"])["speed"]["tokens_per_sec"]
    assert cli_main(["plan", str(QWEN), "--fit", "--margin", "1.5"]) == 2
    assert "--margin: must be in [0, 1)" in capsys.readouterr().err
    assert cli_main(["plan", str(QWEN), "-o", "x.json"]) == 2
    assert "needs --fit" in capsys.readouterr().err
    assert cli_main(["plan", str(QWEN), *AT_4096, "--device", "V100-16GB", "--gpus", "8", "--fit", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["after"]["memory_gib"] <= 16 * 0.9


def test_speed_model_terms(monkeypatch):
    r = _plan([], "A100-80GB", 4)
    plain = fit_search.speed(r)
    # 4 data ranks in one node: their gradient all-reduce over the A100's NVLink (600 GB/s both ways, 300 one way)
    assert r.traffic_gb_per_step["dp"] > 0 and r.layout["axes"]["data"]["inside_node"]
    assert plain["comm_seconds"] == pytest.approx(r.traffic_gb_per_step["dp"] / 300)
    assert plain["tokens_per_sec"] == pytest.approx(
        r.tokens_per_step / plain["step_seconds"])
    z3 = fit_search.speed(_plan(["--sharding", "stage3"], "A100-80GB", 4))
    tp = fit_search.speed(_plan(["--tensor_parallel_degree", "2", "--gradient_accumulation_steps", "2"], "A100-80GB", 4))
    rc = fit_search.speed(_plan(["--recompute", "true"], "A100-80GB", 4))
    assert z3["comm_seconds"] > 0 and z3["compute_seconds"] == pytest.approx(plain["compute_seconds"])
    assert tp["comm_seconds"] > 0 and tp["compute_seconds"] == pytest.approx(plain["compute_seconds"])
    assert rc["compute_seconds"] > plain["compute_seconds"]
    assert rc["comm_seconds"] == pytest.approx(plain["comm_seconds"])
    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda **kw: (None, "this CPU reports no clock or vector flags"))
    cpu = fit_search.speed(_plan([], "cpu"))
    assert cpu["tokens_per_sec"] is None and cpu["rank_seconds"] > 0  # no peak: ranked, not shown


def test_a_layout_train_cannot_run_is_never_chosen(monkeypatch):
    """Candidates go through the same refusals as `train` (`config.resolve` raising): here tensor parallelism is
    made one `resolve` refuses, so the fit finds another way or none."""
    import pretrain_cli.config.resolve as resolve_module

    free = fit(str(QWEN), AT_4096 + UNFUSED, device="V100-16GB", gpus=8)
    assert ("tensor_parallel_degree", 1, 2) in free["diff"]
    real = resolve_module.resolve

    def refusing_tp(args, cfg, target):
        run = real(args, cfg, target)
        if run.parallel.tp_degree > 1:
            raise UserError("tensor_parallel_degree: refused for this test")
        return run

    monkeypatch.setattr(resolve_module, "resolve", refusing_tp)
    f = fit(str(QWEN), AT_4096 + UNFUSED, device="V100-16GB", gpus=8)
    assert f["valid"] < free["valid"]
    assert f["after"] is None or "tensor_parallel_degree" not in f["change"]


def test_a_candidate_resolves_as_the_file_does_and_a_refused_product_is_refused_before_the_rest():
    """`Target.candidate` (every `--fit` candidate): a layout that runs resolves to the same run as without it; a
    product of degrees the parallel rules refuse raises that refusal without resolving the rest of the file again
    (here the rest holds a problem of its own, which the candidate's error does not reach)."""
    import dataclasses

    from pretrain_cli.config.resolve import resolve
    from pretrain_cli.orchestration.planned import parse as parsed, with_changes
    from pretrain_cli.run_config import Target

    args, cfg = parsed(str(QWEN), AT_4096)
    target = Target(device="gpu", world_size=8, gpu_name="A100-80GB", planned=True)
    ok = with_changes(args, {"tensor_parallel_degree": 2, "sharding": "stage1"})
    assert resolve(ok, cfg, dataclasses.replace(target, candidate=True)) == resolve(ok, cfg, target)
    refused = with_changes(args, {"pipeline_parallel_degree": 2, "sharding": "stage3", "warmup_steps": -1})
    with pytest.raises(UserError) as whole:
        resolve(refused, cfg, target)
    with pytest.raises(UserError) as first:
        resolve(refused, cfg, dataclasses.replace(target, candidate=True))
    assert any("warmup_steps" in line for line in whole.value.lines)
    assert list(first.value.lines) == [line for line in whole.value.lines if "stage3" in line]


def test_out_of_memory_line_on_a_known_gpu_names_it_and_the_fitted_layout(monkeypatch, tmp_path):
    """The GPU path of `train`'s out-of-memory line (CPU is tested end to end in tests/e2e/test_cli.py): the device
    is named from the hardware table, and the suggestion is `--fit`'s layout under 90 % of the smaller of the
    device and the failed layout's estimate."""
    import argparse

    from pretrain_cli import runtime
    from pretrain_cli.commands import train
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    monkeypatch.setattr(runtime, "gpu_name", lambda: "Tesla V100-SXM2-16GB")  # as the driver names it
    ns = argparse.Namespace(config=str(QWEN), overrides=list(AT_4096))
    from data_helpers import write_tokens

    data = write_tokens(tmp_path / "data", n_docs=4, doc_len=4200, vocab_size=1000)  # (the file's ./data is not here)
    spec = prepare(str(QWEN), [*AT_4096, "--tokenizer_name_or_path", "null", "--input_dir", data, "--do_eval", "false",
                               "--do_predict", "false"],  # (nor its Qwen tokenizer)
                   Target(device="gpu", world_size=1))
    line = train.out_of_memory_line(ns, spec, 7)
    assert line.startswith("out of memory at step 7 on 1 x V100-16GB: top plan suggestion for this run: "), line
    assert "recompute false -> true" in line
    assert f"`pretrain-cli plan {QWEN} --device V100-16GB --gpus 1 --fit -o fitted.json` writes it" in line
    assert "\n" not in line and line.endswith("re-run to resume from the last one")
    monkeypatch.setattr(runtime, "gpu_name", lambda: "Moore Threads MTT S4000")  # a GPU the table does not know
    line = train.out_of_memory_line(ns, spec, 7)
    assert line == (f"out of memory at step 7; `pretrain-cli plan {QWEN} --device <your GPU> --gpus 1 --fit` finds a "
                    "layout that fits (checkpoints are untouched)")


def test_bf16_on_a_v100_keeps_the_warning_and_fits_in_fp16(tmp_path, capsys):
    out = tmp_path / "fitted.json"
    assert cli_main(["plan", str(QWEN), *AT_4096, "--bf16", "true", "--fp16", "false", "--device", "V100-16GB",
                     "--gpus", "8", "--fit", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "note: bf16: WARNING: V100-16GB has no bf16 tensor cores" in text  # what plain `plan` says, kept
    assert "the fitted layout runs fp16" in text and "bf16: true -> false" in text and "fp16: false -> true" in text
    assert "tokens/s unknown" not in text.split("->")[-1]  # the fitted layout has a speed (fp16 has a V100 peak)
    fitted = json.loads(out.read_text())
    assert fitted["bf16"] is False and fitted["fp16"] is True


def test_without_a_speed_estimate_the_fewest_changes_win_and_it_says_so(monkeypatch):
    monkeypatch.setattr(hardware, "cpu_peak_tflops", lambda **kw: (None, "this CPU reports no clock or vector flags"))
    f = fit(str(QWEN), AT_4096, device="cpu", gpus=1)
    assert f["ranked_by"] == "fewest changes" and any("no estimate" in n and "fewest changes" in n for n in f["notes"])
    assert f["after"] is not None and f["after"]["speed"]["tokens_per_sec"] is None
    import dataclasses

    base = _plan(AT_4096, "cpu")
    current = {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "recompute": False,
               "recompute_granularity": "full", "use_flash_attention": False, "sharding": "stage2",
               "tensor_parallel_degree": 1}

    def faster(change):  # every other layout is (nominally) faster
        flops = dataclasses.replace(base.flops_per_token, hardware=base.flops_per_token.hardware / 2)
        stages = tuple({**st, "tflops_per_step": st["tflops_per_step"] / 2} for st in base.stages)  # (speed's)
        return dataclasses.replace(base, recompute=str(change), flops_per_token=flops, stages=stages)

    peaked = dataclasses.replace(base, device=dataclasses.replace(base.device, peak_tflops=1.0))
    assert fit_search.search(current, peaked, faster, 1e9)["best"]["change"] != {}  # a peak: ranked by speed
    assert fit_search.search(current, base, faster, 1e9)["best"]["change"] == {}  # none: the fewest changes


def test_the_file_is_read_once_and_candidates_are_resolved_from_the_parsed_arguments(monkeypatch):
    """No `--key value` round trip: every candidate is the parsed `Arguments` with its key changes, resolved again."""
    from pretrain_cli.config import parser
    from pretrain_cli.orchestration import planned

    reads = []
    real = parser.load_json
    monkeypatch.setattr(parser, "load_json", lambda path: reads.append(path) or real(path))
    f = fit(str(QWEN), AT_4096, device="V100-16GB", gpus=8)
    assert reads == [str(QWEN)] and f["tried"] > f["valid"] > 1
    args = parser.parse_config(str(QWEN), AT_4096)
    changed = planned.with_changes(args, {"tensor_parallel_degree": 2, "recompute": True})
    assert (changed.get("tensor_parallel_degree"), changed.get("recompute")) == (2, True)
    assert changed.explicit["recompute"] == "command line" and args.get("recompute") is False  # a copy


def test_plan_flags_are_checked_once_per_command(monkeypatch):
    """`plan` and `plan --fit` check their own flags where they come in, once, not again per candidate."""
    from pretrain_cli.orchestration import plan_options

    calls = []
    check = plan_options.check_flags
    monkeypatch.setattr(plan_options, "check_flags", lambda *a, **kw: calls.append(a) or check(*a, **kw))
    assert cli_main(["plan", str(QWEN), *AT_4096, "--device", "V100-16GB", "--gpus", "8", "--fit", "--json"]) == 0
    assert len(calls) == 1
    assert cli_main(["plan", str(QWEN), *AT_4096, "--device", "V100-16GB", "--json"]) == 0
    assert len(calls) == 2


def test_groups_inside_a_node_use_the_in_node_link_and_groups_across_nodes_the_cross_node_link():
    """The same 16-rank data-parallel layout: on nodes of 16 its gradient all-reduce runs on NVLink, on nodes of 8 it
    crosses nodes at `--cross_node_gbps`; the links are the device's (NVLink halved, else PCIe one way)."""
    from pretrain_cli.orchestration import plan_options, planned
    from pretrain_cli.planning import hardware

    args, cfg = planned.parse(str(QWEN), ["--sharding", "stage1"])
    one = planned.plan(args, cfg, "H100", 16, suggest_changes=False, node=hardware.Node(16))
    two = planned.plan(args, cfg, "H100", 16, suggest_changes=False, node=hardware.Node(8, 25.0))
    dp = one.traffic_gb_per_step["dp"]
    assert dp == two.traffic_gb_per_step["dp"] > 0
    assert fit_search.speed(one)["comm_seconds"] == pytest.approx(dp / 450)
    assert fit_search.speed(two)["comm_seconds"] == pytest.approx(dp / 25)
    assert hardware.links(hardware.lookup("H100-PCIe")).in_node_gbps == 63.0  # PCIe 5.0 x16, one way
    assert hardware.links(hardware.lookup("A100-80GB")).in_node_gbps == 300.0
    with pytest.raises(UserError, match="--gpus_per_node"):
        plan_options.check_flags("H100", 16, None, None, node=hardware.Node(0))
    with pytest.raises(UserError, match="--cross_node_gbps"):
        plan_options.check_flags("H100", 16, None, None, node=hardware.Node(8, 0.0))


def test_plan_and_fit_print_both_links(capsys):
    assert cli_main(["plan", str(QWEN), "--device", "H100", "--gpus", "16", "--gpus_per_node", "4",
                     "--cross_node_gbps", "25"]) == 0
    text = capsys.readouterr().out
    assert "links per GPU: in-node 450 GB/s (H100-SXM NVLink 900 GB/s both directions, one way), cross-node " \
           "25 GB/s; 4 GPUs per node" in text
    assert "data-parallel gradients" in text and "(cross-node 25 GB/s)" in text
    assert cli_main(["plan", str(QWEN), "--device", "H100", "--gpus", "16", "--fit", "--json"]) == 0
    links = json.loads(capsys.readouterr().out)["device"]["links"]
    assert (links["in_node_gbps"], links["cross_node_gbps"], links["gpus_per_node"]) == (450, 50, 8)


def test_the_fit_flags_help_names_every_axis_the_search_varies():
    """`plan --help` said "... tensor-parallel and pipeline degree": the search also varies sequence parallelism,
    the context-parallel degree and, for a Mixture-of-Experts model, the expert-parallel degree (its report line
    names them, `fit_report.format_fit`)."""
    import argparse

    from pretrain_cli.commands import plan as plan_command

    parser = argparse.ArgumentParser()
    plan_command.add_arguments(parser)
    text = " ".join(next(a.help for a in parser._actions if "--fit" in a.option_strings).split())
    for axis in ("micro-batch", "recompute", "flash attention", "sharding stage", "tensor-parallel",
                 "sequence parallelism", "pipeline", "context-parallel", "expert-parallel"):
        assert axis in text, axis
