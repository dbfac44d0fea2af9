"""A CPU run whose file leaves `use_flash_attention` out materialises the attention scores (sdpa_mask) where the
block-causal CPU kernel is one key away: one note says so, with the speed-up measured at the bench shape and where
(docs/PERFORMANCE.md §10); it said only `attention sdpa_mask (the [b, heads, s, s] scores materialised)`."""
from run_helpers import resolve_run

NOTE = "use_flash_attention: not set, so attention on CPU materialises the [b, heads, s, s] scores (sdpa_mask)"


def _said(run) -> list[str]:
    return [n for n in run.notes if n.startswith("use_flash_attention:")]


def test_a_cpu_run_without_the_key_is_told_of_the_block_causal_kernel_once():
    run = resolve_run()
    assert run.kernels.attention == "math"
    [note] = _said(run)
    assert note.startswith(NOTE) and "true selects the block-causal CPU kernel" in note
    # the figure is the shape's it was measured at, and cites where (no seconds: they are one machine's moment)
    assert note.endswith("faster (2.2x a step at benchmarks/configs/bench.json's shape, 8 x 256 tokens: "
                         "docs/PERFORMANCE.md §10)")
    assert " s " not in note and " s)" not in note
    # the key set either way is the user's choice; without the CPU kernels there is nothing to select
    assert not _said(resolve_run("--use_flash_attention", "true"))
    assert not _said(resolve_run("--use_flash_attention", "false"))
    assert not _said(resolve_run("--cpu_fused_ops", "false"))


def test_the_note_is_printed_once_in_checks_start_up(tmp_path):
    from data_helpers import write_tokens

    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target

    spec = prepare(None, ["--model_name_or_path", "micro-qwen2", "--input_dir", write_tokens(tmp_path / "docs"),
                          "--output_dir", str(tmp_path / "out"), "--do_train", "--max_steps", "2", "--device", "cpu"],
                   Target("cpu", 1))
    lines = spec.describe()
    assert sum(NOTE in line for line in lines) == 1, lines


def test_no_note_where_context_parallelism_runs_the_same_blocks_either_way():
    """context_parallel_degree 2 on 2 CPU processes: ring attention over the reference blocks whatever
    use_flash_attention says, so 'true selects the block-causal CPU kernel' was false there."""
    from pretrain_cli.config.compute import attention_words

    run = resolve_run("--context_parallel_degree", "2", world=2)
    assert run.parallel.cp_degree == 2 and not _said(run)
    flash = resolve_run("--context_parallel_degree", "2", "--use_flash_attention", "true", world=2)
    assert attention_words(run.kernels, "cpu", "causal", 2) == attention_words(flash.kernels, "cpu", "causal", 2)
    assert _said(resolve_run("--context_parallel_degree", "2"))  # one process: no cp, the kernel is one key away
