"""What a finished run is used for: its model in transformers with the same loss, and `eval` / `generate` on it."""
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

from pretrain_cli.cli import main as cli_main

from e2e_helpers import write_config


def weights(d):
    return load_file(str(d / "model.safetensors"))


@pytest.mark.parametrize("model", ["micro-qwen2", "micro-llama"])
def test_checkpoint_loads_in_transformers_with_same_eval_loss(corpus, tmp_path, model):
    """The output directory and its checkpoint-N load in transformers: the model with our eval loss, and the
    tokenizer (AutoTokenizer) with exactly the ids the token files were made with."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pretrain_cli.data.tokenizer import load_tokenizer

    from pretrain_cli.data.indexed import open_token_file
    from pretrain_cli.models.config import ModelConfig
    from pretrain_cli.training.weight_source import load_for_inference
    from pretrain_cli.training.evaluation import loss_sum, read_tokens, window_batches

    cfg = write_config(tmp_path, corpus, max_steps=6, model_name_or_path=model)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    prefix = str(corpus / "data" / "docs")
    ours = load_tokenizer(corpus / "tokenizer")
    texts = ["a\n\nb", "  x  ", "p\r\nq\r\n\r\n", "\tx\t\ty", "def f(x):\n    return x\n\n\n", "日本語 中文",
             "café cafe\u0301", json.loads((corpus / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[3])["text"]]
    for d in (out, out / "checkpoint-6"):
        hf_tok = AutoTokenizer.from_pretrained(str(d))
        assert [hf_tok.encode(t, add_special_tokens=False) for t in texts] == [ours.encode(t) for t in texts], d
    model, _ = load_for_inference(out, ModelConfig.from_file(str(out)), 0)
    total, count, _ = loss_sum(model, window_batches(read_tokens(prefix)[0], 32, 4, max_batches=3))
    ours = {"loss": total / count}
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    tokens = open_token_file(prefix)
    flat = np.asarray(tokens.tokens(0, 3 * 4 * 32 + 1), dtype=np.int64)
    windows = np.stack([flat[k * 32:k * 32 + 33] for k in range(12)])
    with torch.no_grad():
        logits = hf(torch.from_numpy(windows[:, :-1])).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.from_numpy(windows[:, 1:]).reshape(-1))
    assert ours["loss"] == pytest.approx(float(loss), abs=1e-4)


def test_eval_and_generate_take_the_runs_settings_and_overrides(corpus, tmp_path, capsys):
    """eval/generate on a run's directory use its args.json (window length, kernels) with train's overrides;
    eval --config takes train's overrides and a run's args.json; --data with --config and another window
    length than training's each get a note; overrides without a run are one line."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2)
    assert cli_main(["train", cfg, "--num_hidden_layers", "1"]) == 0
    trained = next(line for line in capsys.readouterr().out.splitlines() if "kernels: " in line).split("kernels: ")[1]
    out, data = str(tmp_path / "out"), str(corpus / "data" / "docs")

    def run(*argv):
        assert cli_main(list(argv)) == 0, argv
        printed = capsys.readouterr()
        return json.loads(printed.out), printed.err

    by_config, _ = run("eval", "--config", cfg, "--json", "--num_hidden_layers", "1")
    by_record, _ = run("eval", "--config", f"{out}/args.json", "--json")
    by_model, _ = run("eval", "--model", out, "--json")  # a run's directory: its own valid split
    assert by_config["loss"] == by_record["loss"] == by_model["loss"] and by_model["split"] == "valid"
    assert by_config["kernels"] == by_model["kernels"] == trained
    windows, err = run("eval", "--model", out, "--data", data, "--max_batches", "2", "--json")
    assert windows["max_seq_length"] == 32 and windows["kernels"] == trained and "note:" not in err
    _, err = run("eval", "--model", out, "--data", data, "--max_batches", "2", "--max_seq_length", "16", "--json")
    assert "note: 16-token windows; the model was trained on 32-token ones" in err
    _, err = run("eval", "--config", cfg, "--data", data, "--max_batches", "1", "--json")
    assert f"note: --data {data}: its windows, in {cfg}'s settings" in err
    # --data's windows come from the model the file's output_dir holds: its num_hidden_layers changes nothing here
    assert cli_main(["eval", "--config", cfg, "--num_hidden_layers", "1", "--data", data]) == 2
    assert capsys.readouterr().err.startswith("error: --num_hidden_layers: a training key that changes nothing eval")
    generated, err = run("generate", "--model", out, "--prompt", "The", "--max_new_tokens", "2", "--json")
    assert generated["kernels"] == trained
    flash_off, _ = run("generate", "--model", out, "--prompt", "The", "--max_new_tokens", "2", "--json",
                       "--use_flash_attention", "false")  # train's key, train's meaning
    assert flash_off["kernels"] != trained and "attention=cpu" in trained
    assert cli_main(["eval", "--model", "micro-qwen2", "--data", data, "--max_seq_length", "16", "--max_steps",
                     "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max_steps 3: --key value overrides change a run's settings" in err[0]


def test_eval_and_generate_on_a_run_stopped_before_its_export_take_its_newest_checkpoint(corpus, tmp_path, capsys):
    """A run's output_dir with args.json and checkpoint-N/ but no final model (stopped before its export): eval
    and generate --model take its newest checkpoint and say so in a note, as eval --config does."""
    cfg = write_config(tmp_path, corpus, max_steps=4, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    for p in out.iterdir():  # what the run had written before its final export
        if p.is_file() and p.name not in ("args.json", "metrics.jsonl"):
            p.unlink()
    capsys.readouterr()
    newest = out / "checkpoint-4"
    note = f"note: {out} holds no final model yet (its run stopped before the export): using its newest checkpoint, {newest}"
    results = []
    for argv in (["eval", "--model", str(out)], ["generate", "--model", str(out), "--prompt", "The",
                 "--max_new_tokens", "3"], ["eval", "--config", str(out / "args.json")]):
        assert cli_main([*argv, "--json"]) == 0, argv
        printed = capsys.readouterr()
        results.append(json.loads(printed.out))
        assert note in printed.err.splitlines(), argv
    by_model, generated, by_config = results
    assert by_model["model"] == by_config["model"] == str(newest) and by_model["loss"] == by_config["loss"]
    assert by_model["split"] == "valid" and generated["model"] == str(newest)
    assert generated["model_weights"] == "trained weights"
    # a run still training there (its lock held by a live process of this host): said so; export points at the newest
    import os
    import socket

    from pretrain_cli.training import run_lock

    (out / run_lock.LOCK_FILE).write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
    assert cli_main(["eval", "--model", str(out), "--json"]) == 0
    assert f"holds no final model yet (its run is still training: pid {os.getpid()})" in capsys.readouterr().err
    assert cli_main(["export", str(out), str(tmp_path / "hf")]) == 2
    assert f"export its newest checkpoint, {newest}" in capsys.readouterr().err


def test_eval_on_a_multi_process_runs_directory_reads_the_windows_its_evaluation_read(corpus, tmp_path, capsys):
    """A run on D data ranks evaluates eval_iters global batches of per_device_eval_batch_size x D windows, each
    rank its slice: eval --model on its directory reads eval_iters x D batches, the same windows, so it says the
    logged eval_loss. It read eval_iters batches (PaddleNLP's DeepSeek-V3 file on 8 processes, pp 2 x ZeRO-1 over 4:
    10 of its 40 windows, loss 6.2464 against the run's 6.2423). A one-process run of eval_iters 4 batches of 2 is
    what a 2-data-rank run of eval_iters 2 evaluates, so its record is rewritten as that run's."""
    cfg = write_config(tmp_path, corpus, max_steps=1, save_steps=1, do_eval=True, do_predict=True,
                       per_device_eval_batch_size=2, eval_iters=4)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    logged = json.loads((out / "all_results.json").read_text())
    record = json.loads((out / "args.json").read_text())
    for part in ("arguments", "user_arguments"):
        record[part]["eval_iters"] = 2
    record["run"]["loop"].update(eval_iters=2, test_iters=20)
    record["run"]["parallel"].update(world_size=2, sharding_degree=2, sharding_stage=1)
    (out / "args.json").write_text(json.dumps(record))
    capsys.readouterr()
    for split, loss in (("valid", logged["eval_loss"]), ("test", logged["test_loss"])):
        assert cli_main(["eval", "--model", str(out), "--split", split, "--json"]) == 0
        printed = capsys.readouterr()
        again = json.loads(printed.out)
        per_rank = 2 if split == "valid" else 20  # the one-process run's 4 (40) batches of 2
        assert again["batches"] == 2 * per_rank and again["loss"] == pytest.approx(loss, abs=1e-6)
        assert (f"note: {out}/args.json: its run evaluated {per_rank} batches of 2 on each of 2 data ranks; the same "
                f"{per_rank * 4} windows here, as {per_rank * 2} batches of 2") in printed.err
    assert cli_main(["eval", "--model", str(out), "--max_batches", "2", "--json"]) == 0  # the user's count stands
    printed = capsys.readouterr()
    assert json.loads(printed.out)["batches"] == 2 and "data ranks" not in printed.err
    assert "samples repeat" not in printed.err
    # more batches than the split holds: said (it printed "N samples" of a split that holds fewer, repeated silently)
    from pretrain_cli.data import build_datasets

    held = len(build_datasets(str(corpus / "data"), "90,5,5", 32, 7, need=("valid",)).get("valid"))
    many = held // 2 + 3  # batches of 2
    assert cli_main(["eval", "--model", str(out), "--max_batches", str(many), "--json"]) == 0
    assert (f"note: the valid split holds {held} samples: {many} batches of 2 read {2 * many}, so samples repeat; "
            f"--max_batches {held // 2} reads each at most once\n") in capsys.readouterr().err


def test_eval_of_a_runs_test_split_says_when_its_own_count_repeats_samples(corpus, tmp_path, capsys):
    """`eval --model OUT --split test` reads the run's 10 x eval_iters batches; on a small corpus the test split holds
    fewer samples, and the loss came from samples read several times without a word (a user's 183-document corpus:
    240 samples of a 50-sample split). Said as for a --max_batches that large."""
    from pretrain_cli.data import build_datasets

    held = len(build_datasets(str(corpus / "data"), "90,5,5", 32, 7, need=("test",)).get("test"))
    eval_iters = held // 20 + 1  # the test split: 10 x eval_iters batches of 2 > held samples
    cfg = write_config(tmp_path, corpus, max_steps=1, save_steps=1, per_device_eval_batch_size=2, eval_iters=eval_iters)
    assert cli_main(["train", cfg]) == 0
    capsys.readouterr()
    assert cli_main(["eval", "--model", str(tmp_path / "out"), "--split", "test", "--json"]) == 0
    printed = capsys.readouterr()
    assert json.loads(printed.out)["batches"] == 10 * eval_iters
    assert (f"note: the test split holds {held} samples: {10 * eval_iters} batches of 2 read {20 * eval_iters}, so "
            f"samples repeat; --max_batches {held // 2} reads each at most once\n") in printed.err
    # a batch larger than the split: no --max_batches reads each once, a batch of the split's size does
    assert cli_main(["eval", "--model", str(tmp_path / "out"), "--split", "test", "--batch_size", str(held + 1),
                     "--max_batches", "1", "--json"]) == 0
    assert (f"note: the test split holds {held} samples: 1 batch of {held + 1} read {held + 1}, so samples repeat; "
            f"--batch_size {held} --max_batches 1 reads each once\n") in capsys.readouterr().err


def test_inspect_data_resolves_a_run_on_its_data_ranks(corpus, tmp_path, capsys):
    """inspect-data --config --step K shows the step as train ran it: a run's record (args.json) on the data ranks
    it had, and --dp_size N as a launch on N would resume (the checkpoint's global batch kept by the accumulation).
    It resolved one process: PaddleNLP's DeepSeek-V3 file's record (8 processes, 4 data ranks x acc 10) said
    'micro_bs 1 x dp 1 x acc 40', with --dp_size 4 'dp 4 x acc 40': step 2 read samples [160, 320), the run's
    steps 5-8 (its step 8's logged batch_hash among them)."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2, per_device_train_batch_size=2,
                       gradient_accumulation_steps=4)  # 8 sequences a step
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    capsys.readouterr()

    def step(*argv):
        assert cli_main(["inspect-data", "--config", *map(str, argv), "--step", "2", "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        return info["samples"], len(info["micro_steps"]), len(info["micro_steps"][0]["ranks"])

    assert step(cfg) == ([8, 16], 4, 1)  # the run itself
    assert step(cfg, "--dp_size", 2) == ([8, 16], 2, 2)  # a resume on 2 data ranks keeps 8: acc 2
    for where in (out, out / "checkpoint-2"):  # as a 2-data-rank run of the same batch records them
        record = json.loads((where / "args.json").read_text())
        for part in ("arguments", "user_arguments"):
            record[part]["gradient_accumulation_steps"] = 2
        record["run"]["loop"]["grad_accum"] = 2
        record["run"]["parallel"].update(world_size=2, dp_degree=2)
        (where / "args.json").write_text(json.dumps(record))
    assert step(out / "args.json") == ([8, 16], 2, 2)
    assert step(out / "args.json", "--dp_size", 1) == ([8, 16], 4, 1)


def test_generate_is_seeded_and_greedy_is_deterministic(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=4)
    assert cli_main(["train", cfg]) == 0
    capsys.readouterr()
    out = str(tmp_path / "out")
    runs = []
    for extra in ([], [], ["--temperature", "1.0", "--seed", "5"], ["--temperature", "1.0", "--seed", "5"],
                  ["--temperature", "1.0", "--seed", "6", "--top_k", "50", "--top_p", "0.9"]):
        assert cli_main(["generate", "--model", out, "--prompt", "The", "--max_new_tokens", "12", "--json",
                         *extra]) == 0
        printed = capsys.readouterr()
        runs.append(json.loads(printed.out)["tokens"])
    # the kernels of the run that wrote the directory (its args.json: use_flash_attention, the CPU kernel), printed
    assert "kernels: attention=cpu " in printed.err and "head+loss=cpu" in printed.err
    assert runs[0] == runs[1] and runs[2] == runs[3]
    assert len(runs[2]) <= 12 and all(0 <= t < 512 for r in runs for t in r)
