"""PaddleNLP's own pretraining files, as shipped but for local paths, through `pretrain-cli check` and `plan`: its
0.5B Qwen and Llama files pass `check`, a hub tokenizer not on disk is one line saying how to fetch it, its qwen and
llama pretrain_argument.json check at 8 ranks and `plan` fits them on 8 x A100-80GB, and
configs/llama-3.1-70b_pretrain.json (its 65-70B recipe) checks at 64 ranks."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from pretrain_cli.cli import main as cli_main

from e2e_helpers import header_only_shards

REPO = Path(__file__).resolve().parents[2]
PADDLENLP = Path(__file__).with_name("paddlenlp_configs")


def _big_corpus(root: Path) -> None:
    """1,000 documents of 4,200 tokens: every split of '949,50,1' holds a 4,097-token sample."""
    from pretrain_cli.data.indexed_writer import IndexedDatasetWriter

    rng = np.random.default_rng(0)
    (root / "data").mkdir(parents=True)
    with IndexedDatasetWriter(str(root / "data" / "corpus"), dtype=np.uint16) as w:
        for _ in range(1000):
            w.add_item(rng.integers(4, 500, size=4200))
            w.end_document()
        w.finalize()


@pytest.mark.parametrize("name", ["qwen_pretrain_argument_0p5b.json", "llama_pretrain_argument.json"])
def test_paddlenlp_shipped_files_pass_check(corpus, tmp_path, monkeypatch, capsys, name):
    _big_corpus(tmp_path)
    shutil.copytree(corpus / "tokenizer", tmp_path / "tokenizer")
    cfg = json.loads((PADDLENLP / name).read_text())
    cfg["tokenizer_name_or_path"] = "./tokenizer"  # the only change: local paths (model names are presets)
    (tmp_path / name).write_text(json.dumps(cfg))
    monkeypatch.chdir(tmp_path)
    from pretrain_cli.planning import hardware

    # checked on this CPU, the files' 8 B Llama is refused for this machine's memory (`host_fit`): a host with room
    monkeypatch.setattr(hardware, "cpu_memory_gib", lambda: 2000.0)
    monkeypatch.setattr(hardware, "host_available_gib", lambda *a, **k: (2000.0, "MemAvailable"))
    assert cli_main(["check", name]) == 0
    out = capsys.readouterr().out
    assert "check: OK" in out and "warmup_steps=30 wins over warmup_ratio=0.01" in out
    assert "sharding='stage2' has no effect" in out
    assert ("distributed_dataloader: accepted but has no effect" in out)
    assert cli_main(["check", name, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["run"]["schedule"]["warmup_steps"] == 30 and summary["run"]["schedule"]["decay_steps"] == 10000
    assert summary["tokens_per_step"] == cfg["per_device_train_batch_size"] * cfg["gradient_accumulation_steps"] \
        * cfg["max_seq_length"]


def test_paddlenlp_file_with_a_hub_tokenizer_not_on_disk_is_one_line(corpus, tmp_path, monkeypatch, capsys):
    """PaddleNLP's 0.5B file names `tokenizer_name_or_path: Qwen/Qwen2.5-0.5B`: with local data and a small
    preset, `check` fails with one line saying how to fetch it, as for a hub model that is not on disk."""
    _big_corpus(tmp_path)
    shutil.copy(PADDLENLP / "qwen_pretrain_argument_0p5b.json", tmp_path / "qwen.json")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["check", "qwen.json", "--model_name_or_path", "micro-qwen2", "--max_seq_length", "64"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: tokenizer_name_or_path: 'Qwen/Qwen2.5-0.5B' is not on disk"), err
    assert "`huggingface-cli download Qwen/Qwen2.5-0.5B --include" in err[0]
    assert cli_main(["check", "qwen.json", "--model_name_or_path", "micro-qwen2", "--max_seq_length", "64", "--tokenizer_name_or_path",
                     "micro-qwen2"]) == 2
    assert "'micro-qwen2' is a shipped preset, which holds no tokenizer files" in capsys.readouterr().err
    shutil.copytree(corpus / "tokenizer", tmp_path / "Qwen" / "Qwen2.5-0.5B")  # a local directory wins
    assert cli_main(["check", "qwen.json", "--model_name_or_path", "micro-qwen2", "--max_seq_length", "64"]) == 0
    assert "tokenizer: Qwen/Qwen2.5-0.5B" in capsys.readouterr().out


def test_paddlenlp_pretrain_files_as_shipped_check_at_8_ranks_and_plan_fits(corpus, tmp_path, monkeypatch, capsys):
    """PaddleNLP's llm/config/{qwen,llama}/pretrain_argument.json, tokenizer path aside: `check --world_size 8` and
    `plan --device A100-80GB --gpus 8`. The qwen file's `continue_training: 1` needs Qwen2-7B's weights: without
    them one line says how to fetch them; with a local directory of that hub name (as `huggingface-cli download
    Qwen/Qwen2-7B --local-dir Qwen/Qwen2-7B` leaves it) the same file checks."""
    from pretrain_cli.config.presets import PRESET_DIR

    _big_corpus(tmp_path)
    shutil.copytree(corpus / "tokenizer", tmp_path / "tokenizer")
    monkeypatch.chdir(tmp_path)
    for name in ("qwen_pretrain_argument.json", "llama_pretrain_argument.json"):
        cfg = json.loads((PADDLENLP / name).read_text())
        cfg["tokenizer_name_or_path"] = "./tokenizer"
        (tmp_path / name).write_text(json.dumps(cfg))
    assert cli_main(["check", "qwen_pretrain_argument.json", "--world_size", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "continue_training" in err[0] and "'Qwen/Qwen2-7B' is a preset" in err[0]
    assert "`huggingface-cli download Qwen/Qwen2-7B --local-dir Qwen/Qwen2-7B`" in err[0]
    local = tmp_path / "Qwen" / "Qwen2-7B"  # the download's layout: config.json and shards (check reads the headers)
    local.mkdir(parents=True)
    shutil.copy(PRESET_DIR / "qwen2-7b" / "config.json", local / "config.json")
    shards = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    (local / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"t{i}": f for i, f in
                                                                                  enumerate(shards)}}))
    header_only_shards(local, shards)
    for name, layout in (("qwen_pretrain_argument.json", "sharding stage2 x8"),
                         ("llama_pretrain_argument.json", "sharding stage2 x4")):
        assert cli_main(["check", name, "--world_size", "8"]) == 0, name
        out = capsys.readouterr().out
        assert "check: OK — training would start on 8 processes (simulated)" in out and layout in out, out
        assert "note: --world_size 8 checks the run as a launch on 8 GPUs (device gpu" in out
        assert ("pretrained weights" in out) == name.startswith("qwen")
        assert "precision bfloat16 O2" in out and "recompute " + ("full" if name.startswith("qwen") else "off") in out
        assert cli_main(["plan", name, "--device", "A100-80GB", "--gpus", "8"]) == 0
        out = capsys.readouterr().out
        assert "on 8 x A100-80GB" in out and "-> fits" in out, out


def test_llama_70b_file_checks_at_64_ranks_as_tp8_pp4_zero1(corpus, tmp_path, monkeypatch, capsys):
    """configs/llama-3.1-70b_pretrain.json (PaddleNLP's 65-70B recipe: tp 8 x pp 4 x sharding stage1), local
    paths aside: `check --world_size 64` passes it, 2 data ranks of 8 x 4 ranks each."""
    _big_corpus(tmp_path)
    shutil.copytree(corpus / "tokenizer", tmp_path / "tokenizer")
    shutil.copy(REPO / "configs" / "llama-3.1-70b_pretrain.json", tmp_path / "70b.json")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["check", "70b.json", "--world_size", "64"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "check: OK — training would start on 64 processes (simulated)" in out, out
    assert "world 64, dp 1, sharding stage1 x2, tp 8, pp 4" in out, out
    assert "embedding and LM head stay whole on every tensor-parallel rank" in out, out
