"""`plan --fit` skips a larger micro-batch of a layout already over the budget (`planning.fit.grows_with_micro_batch`):
the search's picks are the whole search's, and what the skip relies on, that a layout's memory grows with its
micro-batch and its start-up does not move, holds for the memory model."""
import json
from pathlib import Path

import pytest

from pretrain_cli.orchestration import planned
from pretrain_cli.planning import fit as fit_search

REPO = Path(__file__).resolve().parents[2]
QWEN = REPO / "tests" / "e2e" / "paddlenlp_configs" / "qwen_pretrain_argument_0p5b.json"
LLAMA_8B = REPO / "configs" / "llama-3-8b_pretrain.json"
LLAMA_70B = REPO / "configs" / "llama-3.1-70b_pretrain.json"

MOE = REPO / "configs" / "qwen3-moe-tiny_cpu.json"

# (file, overrides, device, gpus): context parallelism at 16K and 128K, a pipeline, nothing fitting (the smallest
# layout and the fewest devices), a search that skips little, Llama-3.1-70B with cp at 32K, a Mixture-of-Experts
# model with expert parallelism searched (O1 and O2: docs/MOE.md's Qwen3-30B-A3B on 8 H100, 15.6 s whole, 4.0 s
# pruned on a loaded 2-core machine)
CASES = [
    (LLAMA_8B, ["--max_seq_length", "16384"], "A100-40GB", 8),
    (LLAMA_8B, ["--max_seq_length", "131072"], "H100", 8),
    (LLAMA_8B, [], "V100-16GB", 4),
    (QWEN, ["--max_seq_length", "4096"], "V100-16GB", 8),
    (LLAMA_70B, ["--max_seq_length", "32768"], "H100", 32),
    (MOE, ["--model_name_or_path", "Qwen/Qwen3-30B-A3B", "--vocab_size", "151936", "--max_seq_length", "4096",
           "--bf16", "true"], "H100", 8),
]


def _whole(monkeypatch):  # every candidate planned: neither skip (`grows_with_micro_batch`, `state_floor`)
    monkeypatch.setattr(fit_search, "grows_with_micro_batch", lambda r: False)
    monkeypatch.setattr(fit_search, "state_floor", lambda r: 0.0)


@pytest.mark.parametrize("path,overrides,device,gpus", CASES, ids=lambda x: getattr(x, "name", str(x)))
def test_the_pruned_search_picks_what_the_whole_search_picks(path, overrides, device, gpus, monkeypatch):
    """The same result but the counts: the pick (its keys, memory, start-up and speed), the smallest layout and the
    fewest devices where nothing fits. (At 8,192 tokens on 64 H100s Llama-3.1-70B's search plans 2,562 of its 7,965
    candidates, 1.8-2.0 s instead of 6.7-8.1 s, timed on a 2-core machine under other jobs' load, with the same pick.)"""
    _, pruned = planned.fit_file(str(path), overrides, device=device, gpus=gpus)
    _whole(monkeypatch)
    _, whole = planned.fit_file(str(path), overrides, device=device, gpus=gpus)
    counts = ("tried", "valid", "skipped")
    assert json.dumps({k: v for k, v in pruned.items() if k not in counts}, sort_keys=True, default=str) == \
        json.dumps({k: v for k, v in whole.items() if k not in counts}, sort_keys=True, default=str)
    assert whole["skipped"] == 0 and pruned["tried"] + pruned["skipped"] == whole["tried"]
    assert pruned["skipped"] > 0  # each case has a layout over the budget below its largest micro-batch


def test_the_suggestions_search_is_pruned_alike(monkeypatch):
    """`plan` without --fit where no one key fits searches the same candidates by fewest changes against the
    device's whole memory (`orchestration.planned._layout_or_more_devices`): the same suggestions either way."""
    pruned = planned.from_file(str(LLAMA_8B), [], device="V100-16GB", gpus=4).to_json()["suggestions"]
    _whole(monkeypatch)
    whole = planned.from_file(str(LLAMA_8B), [], device="V100-16GB", gpus=4).to_json()["suggestions"]
    assert pruned == whole and pruned


@pytest.mark.parametrize("layout", [
    {"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "sharding": "stage1"},
    {"tensor_parallel_degree": 2, "pipeline_parallel_degree": 4, "sequence_parallel": True, "sharding": ""},
    {"tensor_parallel_degree": 1, "pipeline_parallel_degree": 2, "context_parallel_degree": 2, "sharding": "stage2"},
    {"tensor_parallel_degree": 1, "pipeline_parallel_degree": 1, "sharding": "stage3", "recompute": True,
     "recompute_granularity": "core_attn"},
    {"tensor_parallel_degree": 8, "pipeline_parallel_degree": 1, "sharding": "", "use_flash_attention": False,
     "bf16": False},  # fp32, math attention
], ids=["zero1", "tp2-sp-pp4", "pp2-cp2-zero2", "zero3-core_attn", "tp8-fp32-math"])
@pytest.mark.parametrize("device", ["H100", "cpu"])
def test_memory_grows_with_the_micro_batch_and_start_up_does_not_move(layout, device):
    """What `grows_with_micro_batch` says of a layout without virtual stages or O1, over every micro-batch of a
    global batch of 64 on 16 devices at 8,192 tokens (the fused head + loss turned on by `config.resolve` above a
    micro-batch's tokens included): each larger one no less memory (1F1B's first stage at pp 4 holds as many
    samples at b 8 x 4 micro-batches as at b 16 x 2), more in all, and the same start-up."""
    args, cfg = planned.parse(str(LLAMA_8B), ["--max_seq_length", "8192"])
    replan = planned._replanner(args, cfg, device, 16, None, 0.0, None)
    rows = []
    data_ranks = 16 // (layout["tensor_parallel_degree"] * layout["pipeline_parallel_degree"]
                        * layout.get("context_parallel_degree", 1))
    per_rank = 64 // data_ranks
    for micro in (m for m in range(1, per_rank + 1) if per_rank % m == 0):
        r = replan({**layout, "per_device_train_batch_size": micro, "gradient_accumulation_steps": per_rank // micro})
        assert r is not None and r.micro_batch == micro, (layout, micro)
        assert fit_search.grows_with_micro_batch(r)
        rows.append((r.memory_gib, r.startup_gib))
    assert len(rows) >= 3
    assert all(a[0] <= b[0] for a, b in zip(rows, rows[1:])) and rows[0][0] < rows[-1][0], rows
    assert len({startup for _, startup in rows}) == 1, rows


def test_virtual_stages_and_o1_are_planned_whole():
    """Where the schedule or a default moves with the micro-batch, nothing is skipped."""
    args, cfg = planned.parse(str(LLAMA_8B), [])
    replan = planned._replanner(args, cfg, "H100", 16, None, 0.0, None)
    interleaved = replan({"pipeline_parallel_degree": 4, "virtual_pp_degree": 2, "tensor_parallel_degree": 1,
                          "gradient_accumulation_steps": 8})
    o1 = replan({"fp16_opt_level": "O1"})
    plain = replan({})
    assert interleaved.parallel.vpp == 2 and not fit_search.grows_with_micro_batch(interleaved)
    assert o1.precision.amp_level == "O1" and not fit_search.grows_with_micro_batch(o1)
    assert fit_search.grows_with_micro_batch(plain)


def test_the_fit_line_says_how_many_were_skipped(capsys):
    from pretrain_cli.cli import main as cli_main

    assert cli_main(["plan", str(LLAMA_8B), "--device", "A100-40GB", "--gpus", "8", "--max_seq_length", "16384",
                     "--fit"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert " planned (micro-batch x accumulation" in first
    assert first.endswith(" more skipped: layouts whose state alone, or a smaller micro-batch of them, is over the "
                          "budget")
