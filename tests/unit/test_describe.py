"""The run `check` and `train` describe (`RunSpec.describe`): counts in English, and when evaluation runs as the
strategy makes it (`epoch`: once, after the last step; `steps`: every eval_steps and after the last step)."""
import json

from data_helpers import write_tokens
from pretrain_cli.counts import count
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target


def _describe(tmp_path, **keys) -> str:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(tmp_path / "out"), "do_train": True, "do_eval": True,
                                "max_seq_length": 16, "split": "1,1,1", "tokenizer_name_or_path": None,
                                "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, **keys}))
    return "\n".join(prepare(str(path), [], Target()).describe())


def test_one_of_each_is_said_in_the_singular(tmp_path):
    """It said `1 x acc 1 x 1 data ranks = 1 sequences = 16 tokens/step; 1 steps = 16 tokens`."""
    text = _describe(tmp_path, max_steps=1, eval_steps=1)
    assert "batch: 1 x acc 1 x 1 data rank = 1 sequence = 16 tokens/step; 1 step = 16 tokens" in text, text
    assert "eval once, after the last step (step 1)" in text
    assert "eval every 1 step\n" in _describe(tmp_path, max_steps=2, eval_steps=1)


def test_epoch_evaluates_once_after_the_last_step(tmp_path):
    """`evaluation_strategy: epoch` evaluates once, after the last step (PaddleNLP's one epoch); the line said
    `eval every 6 steps` (eval_steps made max_steps), as if it were an interval."""
    text = _describe(tmp_path, max_steps=6, eval_steps=2, evaluation_strategy="epoch")
    assert "eval once, after the last step (step 6)" in text and "eval every" not in text, text
    assert "batch: 1 x acc 1 x 1 data rank = 1 sequence = 16 tokens/step; 6 steps = 96 tokens" in text


def test_steps_say_when_the_run_evaluates(tmp_path):
    """The run also evaluates after its last step (training.run's final results): an eval_steps past the run's
    length gives that one evaluation, and a last step between two intervals gets one too."""
    text = _describe(tmp_path, max_steps=3, eval_steps=1000)
    assert "eval once, after the last step (step 3; eval_steps is past it)" in text, text
    schedule = {k: next(line for line in _describe(tmp_path, max_steps=k, eval_steps=2).splitlines()
                        if line.startswith("  schedule: ")) for k in (4, 5)}
    assert schedule[4].endswith("; eval every 2 steps") and schedule[5].endswith("; eval every 2 steps and after the "
                                                                                 "last step (5)"), schedule


def test_count():
    assert [count(1, "process"), count(2, "process"), count(1, "GPU"), count(0, "step")] == \
        ["1 process", "2 processes", "1 GPU", "0 steps"]


def test_the_attention_it_names_is_the_kernel_the_run_logs(tmp_path):
    """On CPU the resolved line said `attention flash` where the `kernels:` line of the same run said `attention=cpu`
    (there is no flash-attn on CPU: use_flash_attention picks the fused block-causal kernel). It names the kernel
    `ops.kernels.select` runs for each request, its documents' kernel under a document mask."""
    from pretrain_cli import runtime

    runtime.import_paddle()
    from pretrain_cli.ops.kernels import select

    for keys in ({}, {"use_flash_attention": False}, {"cpu_fused_ops": False},
                 {"attention_mask_type": "document"}, {"attention_mask_type": "document", "use_flash_attention": False}):
        keys = {"use_flash_attention": True, "max_steps": 1, **keys}
        spec_text = _describe(tmp_path, **keys)
        line = next(x for x in spec_text.splitlines() if x.startswith("  device cpu"))
        run = prepare(str(tmp_path / "args.json"), [], Target()).run
        chosen = select(run.kernels, "cpu")
        want = chosen.attention_document_name if keys.get("attention_mask_type") == "document" else \
            chosen.attention_name
        assert f"; attention {want} (" in line and "flash," not in line, (keys, line)


def test_a_moe_model_says_its_routing_and_balancing(tmp_path):
    """The resolved lines said nothing of the experts: a MoE run's balancing was read only in its log."""
    text = _describe(tmp_path, model_name_or_path="micro-qwen3-moe", max_steps=2, router_aux_loss_coef=0.01)
    assert ("  experts: 8 routed + 0 shared, 32 wide each, in 2 of 2 layers, top-2, norm_topk_prob true; balance loss "
            "weight 0.01 "
            "(load-balancing, micro_batch scope), moe_router_bias_update_rate 0 (off); capacity_factor 0 (dropless: "
            "every assignment computed); expert parallel degree 1\n" in text), text
    ds = _describe(tmp_path, model_name_or_path="micro-deepseek-v3", max_steps=2)  # the bias a DeepSeek-V3 run gets
    assert "moe_router_bias_update_rate 0.001; capacity_factor 0 (dropless" in ds and "(sequence-wise)" in ds, ds
    assert "experts:" not in _describe(tmp_path, max_steps=2)


def test_a_deepseek_router_names_its_expert_groups_and_transformers_default(tmp_path):
    """DeepSeek-V3 tiny without n_group/topk_group trained with transformers' 8 groups, 4 kept, without a word:
    the line names the groups, and says when config.json left them to transformers' default."""
    import shutil
    from pathlib import Path

    model = tmp_path / "dsv3"
    shutil.copytree(Path(__file__).resolve().parents[2] / "configs" / "deepseek-v3-tiny", model)
    assert ", top-4 of the top 2 of 4 expert groups, norm_topk_prob true;" in _describe(
        tmp_path, model_name_or_path=str(model), max_steps=2)
    raw = json.loads((model / "config.json").read_text())
    del raw["n_group"], raw["topk_group"]
    (model / "config.json").write_text(json.dumps(raw))
    text = _describe(tmp_path, model_name_or_path=str(model), max_steps=2)
    assert (", top-4 of the top 4 of 8 expert groups (transformers' default: config.json has no n_group or "
            "topk_group), norm_topk_prob true;") in text, text
    assert "expert groups" not in _describe(tmp_path, model_name_or_path="micro-qwen3-moe", max_steps=2)


def test_a_capacity_is_said_as_what_an_expert_keeps_of_a_micro_batch(tmp_path):
    """W1's capacity_factor 1.0 dropped two thirds of the assignments with the experts line silent about it: the
    line now says what the factor keeps at this run's micro-batch (2 x 16 tokens x top-2 = 64 assignments, 8 at
    balance over 8 experts: ceil(1.25 x 8) = 10 kept per expert)."""
    text = _describe(tmp_path, model_name_or_path="micro-qwen3-moe", max_steps=2, per_device_train_batch_size=2,
                     gradient_accumulation_steps=3, capacity_factor=1.25)
    assert ("moe_router_bias_update_rate 0 (off); capacity_factor 1.25: an expert computes at most 10 of a "
            "micro-batch's 64 assignments (32 tokens x top-2; 8 each at balance), the rest dropped (evaluation is "
            "dropless); expert parallel "
            "degree 1\n") in text, text

