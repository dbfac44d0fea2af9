"""PaddleFormers' own keys in its `stage: PT` and benchmark files: the promoted flags and the benchmark file's keys as
notes, attn_impl / _attn_implementation read as use_flash_attention (and `plan --fit` writing it in their place),
LoRA refused. (The files' texts: paddleformers_pt_texts.py.)"""
import pytest

from paddleformers_pt_texts import BENCHMARK_KEYS, notes_by_key, write_file
from pretrain_cli.cli import main as cli_main
from pretrain_cli.config.parser import parse_config
from pretrain_cli.errors import UserError


def test_the_promoted_flags_of_the_ep_file_are_notes_where_they_ask_for_something():
    base = ["--output_dir", "o", "--input_dir", "d", "--max_steps", "5", "--device", "cpu", "--do_train"]
    said = notes_by_key(parse_config(None, [*base, "--clear_every_step_cache", "--partial_send_recv", "false", "--tp_sync_param",
                                      "--sync_grad", "true", "--batch_p2p_comm", "false"]))
    for key in ("clear_every_step_cache", "partial_send_recv", "tp_sync_param", "sync_grad", "batch_p2p_comm"):
        assert said[key].startswith(f"{key}: accepted but has no effect here: "), key
    assert "partial_send_recv" not in notes_by_key(parse_config(None, [*base, "--partial_send_recv"]))

@pytest.mark.parametrize("value,on", [("flashmask", True), ("sdpa", True), ("eager", False)])
def test_each_attention_implementation_reads_as_use_flash_attention(value, on):
    assert parse_config(None, ["--attn_impl", value]).training.use_flash_attention is on
    assert parse_config(None, ["--_attn_implementation", value]).training.use_flash_attention is on


def test_another_attention_implementation_or_both_names_are_refused(tmp_path):
    with pytest.raises(UserError, match="attn_impl: 'sink' is not an attention implementation run here; set it to "
                                        "one of flashmask, sdpa, eager"):
        parse_config(write_file(tmp_path, "attn_impl: sink\n"))
    with pytest.raises(UserError, match="`attn_impl` and `use_flash_attention` are one key"):
        parse_config(write_file(tmp_path, "attn_impl: eager\nuse_flash_attention: true\n"))


def test_lora_is_refused_and_an_omitted_fine_tuning_is_a_note(tmp_path):
    """PaddleFormers' fine_tuning defaults to LoRA (adapters beside a frozen model), which a PT file leaves out at
    its peril: refused when set, a note when left out of a PT file (every parameter trains here)."""
    for where in (lambda: parse_config(write_file(tmp_path, "stage: PT\nfine_tuning: LoRA\n")),
                  lambda: parse_config(None, ["--fine_tuning", "lora"])):
        with pytest.raises(UserError, match="fine_tuning: '(LoRA|lora)' trains LoRA adapters beside a frozen model"):
            where()
    said = notes_by_key(parse_config(write_file(tmp_path, "stage: PT\ninput_dir: d\noutput_dir: o\nmax_steps: 5\ndo_train: 1\n")))
    assert said["fine_tuning"] == ("fine_tuning: not set: PaddleFormers' default, LoRA, trains LoRA adapters under "
                                   "stage PT; every parameter trains here (as fine_tuning: full)")


def test_the_benchmark_files_own_keys_are_notes(tmp_path):
    said = notes_by_key(parse_config(write_file(tmp_path, "stage: dsv3_pretrain\ninput_dir: d\noutput_dir: o\nmax_steps: 5\n"
                                                "do_train: true\n" + BENCHMARK_KEYS)))
    for key in ("pad_token_id", "global_batch_size", "tensorwise_offload_optimizer"):
        assert said[key].startswith(f"{key}: accepted but has no effect here: "), key
    assert "recomputes it" in said["global_batch_size"] and "moe_deep_gemm" not in said  # (false: its default)


def test_plan_fit_writes_use_flash_attention_in_attn_impls_place(tmp_path, capsys):
    """The fit turns flash attention on: the fitted file says so where the file's attn_impl stood, which it replaces
    (both names in one file are refused when read)."""
    src = write_file(tmp_path, "stage: PT\ninput_dir: ./data\nmodel_name_or_path: Qwen/Qwen2.5-0.5B\noutput_dir: ./ck\n"
                           "max_seq_len: 4096\nattn_impl: eager\ntensor_model_parallel_size: 1\n"
                           "per_device_train_batch_size: 8\ngradient_accumulation_steps: 4\nmax_steps: 100\ndo_train: true\n")
    out = str(tmp_path / "fitted.yaml")
    assert cli_main(["plan", src, "--device", "A100-40GB", "--gpus", "8", "--fit", "-o", out]) == 0
    assert "use_flash_attention: false -> true" in capsys.readouterr().out
    lines = (tmp_path / "fitted.yaml").read_text().splitlines()
    assert "attn_impl" not in "\n".join(lines) and lines[5] == "use_flash_attention: true"
    assert parse_config(out).training.use_flash_attention
