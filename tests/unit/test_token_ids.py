"""Where generation ends, on both sides of the Hugging Face boundary: a run's config.json names its tokenizer's
bos/eos/pad ids (not a preset's published ones), and `pretrain-cli generate` stops at every EOS id transformers'
`generate` stops at on the same directory (generation_config.json's list) and at the tokenizer's."""
import json
import re
import shutil

import numpy as np
import pytest

from data_helpers import make_tokenizer, write_tokens
from pretrain_cli.data.tokenizer import load_tokenizer
from pretrain_cli.models.config import ModelConfig
from pretrain_cli.orchestration.opened import tokenizer_ids
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target


def test_a_run_of_a_preset_with_another_tokenizer_writes_the_tokenizers_ids(tmp_path):
    """qwen2.5-0.5b's config.json says bos = eos = 151643 (Qwen's <|endoftext|>); a run with a 300-token tokenizer
    wrote those into its checkpoints, an id outside its own vocabulary, so transformers' generate never stopped at
    the EOS the token files hold."""
    tok_dir = make_tokenizer(tmp_path / "tok")
    tok = load_tokenizer(str(tok_dir))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": "qwen2.5-0.5b", "num_hidden_layers": 1, "vocab_size": 300,
                                "tokenizer_name_or_path": str(tok_dir), "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(tmp_path / "out"), "do_train": True, "max_seq_length": 16,
                                "max_steps": 2, "split": "1,1,1", "device": "cpu"}))
    spec = prepare(str(args), [], Target())
    cfg = spec.model_cfg
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id) == (tok.bos_token_id, tok.eos_token_id,
                                                                     tok.pad_token_id) == (1, 2, 0)
    note = [n for n in spec.run.notes if n.startswith("token ids:")]
    assert note == ["token ids: the run's config.json takes the tokenizer's bos_token_id 1 ([BOT]) for 151643, "
                    "eos_token_id 2 ([EOT]) for 151643 (the model's), the ids its token files hold, so transformers' "
                    "generate stops where pretrain-cli generate does"]
    hf = cfg.to_hf_dict()
    assert (hf["bos_token_id"], hf["eos_token_id"], hf["pad_token_id"]) == (1, 2, 0)


def test_matching_ids_and_an_eos_list_holding_the_tokenizers_are_kept(tmp_path):
    tok = load_tokenizer(str(make_tokenizer(tmp_path / "tok")))
    same = ModelConfig(model_type="llama", bos_token_id=1, eos_token_id=2, pad_token_id=0)
    assert tokenizer_ids(same, tok) == (same, [])
    listed = ModelConfig(model_type="llama", bos_token_id=1, eos_token_id=[7, 2])  # Llama-3-Instruct's kind
    cfg, notes = tokenizer_ids(listed, tok)
    assert cfg.eos_token_id == [7, 2] and cfg.pad_token_id == 0 and notes == []  # a missing pad id: filled, no note


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random llama directory (std 0.2: greedy has no near-ties) with a tokenizer of its vocabulary."""
    from pretrain_cli import runtime

    paddle = runtime.import_paddle()
    from pretrain_cli.models import build_model, convert

    d = tmp_path_factory.mktemp("ids")
    make_tokenizer(d)
    cfg = ModelConfig(model_type="llama", vocab_size=load_tokenizer(str(d)).vocab_size, hidden_size=32,
                      intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
    paddle.seed(0)
    convert.save_hf(build_model(cfg), cfg, str(d))
    return d


def _generate(capsys, model, n):
    from pretrain_cli.cli import main as cli_main

    assert cli_main(["generate", "--model", str(model), "--prompt", "the quick brown", "--max_new_tokens", str(n),
                     "--json"]) == 0
    return json.loads(capsys.readouterr().out)["tokens"]


def test_generate_stops_at_every_eos_transformers_stops_at(model_dir, tmp_path, capsys):
    """generation_config.json may list several EOS ids (Llama-3-Instruct, Qwen2.5-Instruct); transformers stops at
    any of them. pretrain-cli generate read the tokenizer's EOS only and ran past them."""
    import torch
    import transformers

    free = _generate(capsys, model_dir, 12)
    tok = load_tokenizer(str(model_dir))
    assert tok.eos_token_id not in free and len(free) == 12
    k = next(i for i in range(2, 12) if free[i] not in free[:i])  # a token first emitted at step k > 1
    d = tmp_path / "listed"
    shutil.copytree(model_dir, d)
    gen = json.loads((d / "generation_config.json").read_text())
    (d / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [free[k], tok.eos_token_id]}))
    ours = _generate(capsys, d, 12)
    assert ours == free[:k]  # the completion ends before the EOS, as with the tokenizer's
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
    prompt = torch.tensor([tok.encode("the quick brown")])
    with torch.no_grad():
        out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=12,
                          pad_token_id=0)[0, prompt.shape[1]:].tolist()
    assert out == free[:k] + [free[k]]  # transformers keeps the EOS it stopped at, then stops


def test_a_finished_row_repeats_its_own_eos():
    from pretrain_cli.models import generation

    class Fixed:
        """A stand-in model whose next token is fixed per row and step (`generate` reads only the last logits)."""
        config = ModelConfig(model_type="llama", vocab_size=8, max_position_embeddings=32)

        def __init__(self, plan):
            self.plan, self.step = plan, 0

        def eval(self):
            return self

        def new_cache(self):
            return type("Cache", (), {"offset": 0})()

        def __call__(self, ids, cache=None):
            import paddle

            logits = np.full((len(self.plan), 1, 8), -1.0, "float32")  # [bsz, 1, vocab]
            for row, tokens in enumerate(self.plan):
                logits[row, 0, tokens[min(self.step, len(tokens) - 1)]] = 1.0
            self.step += 1
            return paddle.to_tensor(logits)

    out = generation.generate(Fixed([[3, 6, 4, 4], [5, 3, 3, 3]]), np.zeros((2, 1), "int64"), 4,
                              eos_token_id=[5, 6])
    assert out[:, 1:].tolist() == [[3, 6], [5, 5]]  # both done after step 2: no third step


def test_sampling_draws_from_transformers_distribution():
    """temperature, top-k and top-p as transformers' warpers apply them, in their order (the tokens differ: numpy's
    generator, not torch's)."""
    import torch
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    from pretrain_cli.models.generation import next_token_probs

    rng = np.random.default_rng(0)
    for _ in range(50):
        logits = (rng.normal(size=(2, 40)) * 3).astype("float32")  # [bsz, vocab]
        t, k, p = float(rng.uniform(0.3, 2)), int(rng.integers(0, 45)), float(rng.uniform(0.05, 1))
        x = TemperatureLogitsWarper(t)(None, torch.from_numpy(logits))
        x = TopKLogitsWarper(k)(None, x) if k else x
        x = TopPLogitsWarper(p)(None, x) if p < 1 else x
        np.testing.assert_allclose(next_token_probs(logits, t, k, p), torch.softmax(x, -1).numpy(), atol=1e-6)


@pytest.mark.parametrize("text", ["[1, 2]", "{\"eos_token_id\": \"two\"}", "{not json"])
def test_an_unreadable_generation_config_is_one_line(model_dir, tmp_path, capsys, text):
    from pretrain_cli.cli import main as cli_main

    d = tmp_path / "bad"
    shutil.copytree(model_dir, d)
    (d / "generation_config.json").write_text(text)
    assert cli_main(["generate", "--model", str(d), "--prompt", "the", "--max_new_tokens", "2"]) == 2
    out = capsys.readouterr()
    lines = out.err.strip().splitlines()
    where = f"error: {d / 'generation_config.json'}"  # then ": " or, for a JSON mistake, its ":line:col: "
    assert len(lines) == 1 and re.match(re.escape(where) + r"(:\d+:\d+)?: ", lines[0]) and out.out == "", lines
    if text == "{not json":  # the mistake named at its place (pretrain_cli.json_mistakes)
        assert lines[0].startswith(where + ":1:2: invalid JSON: an unquoted key"), lines


@pytest.mark.parametrize("eos, written", [([7, 2], [7, 2]), ([7, 9], 2)])
def test_a_model_directorys_generation_config_is_written_on(tmp_path, eos, written):
    """A run from a model directory (Qwen2.5's, Llama-3-Instruct's) wrote a bare generation_config.json: its sampling
    defaults and eos list were lost in every checkpoint and export. They are written on; the token ids follow the
    run's config.json, except an eos list that holds its EOS."""
    from pretrain_cli.models import convert

    tok_dir = make_tokenizer(tmp_path / "tok")
    src, export = tmp_path / "model", tmp_path / "export"
    src.mkdir(), export.mkdir()
    convert.write_model_config(ModelConfig(model_type="llama", vocab_size=300, hidden_size=16, intermediate_size=24,
                                           num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                           bos_token_id=1, eos_token_id=2), str(src), "float32")
    gen = {"bos_token_id": 1, "eos_token_id": eos, "do_sample": True, "temperature": 0.7, "top_p": 0.8,
           "transformers_version": "4.45.0"}
    (src / "generation_config.json").write_text(json.dumps(gen))
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"model_name_or_path": str(src), "tokenizer_name_or_path": str(tok_dir),
                                "input_dir": write_tokens(tmp_path / "data"), "output_dir": str(tmp_path / "out"),
                                "do_train": True, "max_seq_length": 16, "max_steps": 2, "split": "1,1,1",
                                "device": "cpu"}))
    cfg = prepare(str(args), [], Target()).model_cfg
    convert.write_model_config(cfg, str(export), "float32")
    got = json.loads((export / "generation_config.json").read_text())
    assert got == {**gen, "eos_token_id": written, "pad_token_id": 0}
    assert "generation" not in json.loads((export / "config.json").read_text())
    assert ModelConfig.from_file(str(export)).generation == got  # what eval/generate/export read
    (src / "generation_config.json").write_text("[1")
    from pretrain_cli.errors import UserError

    # a JSON mistake is named at its place (pretrain_cli.json_mistakes), the file named with it
    with pytest.raises(UserError, match=r"generation_config.json:1:3: invalid JSON: the JSON ends before its closing"):
        prepare(str(args), [], Target())
