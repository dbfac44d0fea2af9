"""A run that trained past its model's max_position_embeddings (continue_training keeps that number in the
config.json it saves) records the length it trained on in its args.json: `eval` notes only the positions past that
length, whether its windows are --data's or a run's split (`--config`), and `generate` slides its window there."""
import json

import pytest

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from data_helpers import make_tokenizer, write_tokens  # noqa: E402

from pretrain_cli.cli import main  # noqa: E402
from pretrain_cli.data.tokenizer import load_tokenizer  # noqa: E402
from pretrain_cli.models import build_model, convert, generation  # noqa: E402
from pretrain_cli.models.config import ModelConfig  # noqa: E402

LIMIT, TRAINED = 16, 24  # config.json's max_position_embeddings; the length the run trained at


def _record(d, seq: int, tmp_path) -> None:
    """The args.json a run writes, as far as eval and generate read it: its arguments and its resolved data."""
    arguments = {"model_name_or_path": "micro-llama", "input_dir": str(tmp_path / "data"), "output_dir": str(d),
                 "max_seq_length": seq, "do_train": True}
    (d / "args.json").write_text(json.dumps({"version": "test", "arguments": arguments, "user_arguments": arguments,
                                             "run": {"data": {"max_seq_length": seq},
                                                     "parallel": {"dp_degree": 1, "sharding_degree": 1}}}))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run's final directory: a 16-position llama (its config.json) the run trained at 24 (its args.json), with
    a tokenizer; and a token file of its vocabulary."""
    tmp = tmp_path_factory.mktemp("past")
    d = tmp / "run"
    d.mkdir()
    make_tokenizer(d)
    cfg = ModelConfig(model_type="llama", vocab_size=load_tokenizer(str(d)).vocab_size, hidden_size=16,
                      intermediate_size=24, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=LIMIT)
    paddle.seed(0)
    convert.save_hf(build_model(cfg), cfg, str(d))
    _record(d, TRAINED, tmp)
    data = write_tokens(tmp / "tokens", n_docs=4, doc_len=64, vocab_size=cfg.vocab_size)
    return d, data


def _notes(capsys, *argv) -> list[str]:
    assert main(list(argv)) == 0, argv
    return [line for line in capsys.readouterr().err.splitlines() if "is past the model's" in line]


def test_eval_notes_no_position_its_run_trained_on(run, capsys):
    """`eval --model RUN --data X` takes the run's own length (24): the run trained on positions 16-23, so no note
    says the model has not seen them; a length past the run's notes only the positions past it."""
    d, data = run
    assert _notes(capsys, "eval", "--model", str(d), "--data", data, "--max_batches", "1") == []
    assert _notes(capsys, "eval", "--model", str(d), "--data", data, "--max_seq_length", "32", "--max_batches",
                  "1") == [
        "note: --max_seq_length: 32 is past the model's max_position_embeddings (16) and the 24 tokens its run "
        "trained on: positions 24-31 take RoPE angles computed as transformers computes them (RoPE has no position "
        "table), angles a model trained to 24 has not seen"]


def test_eval_of_a_model_no_run_wrote_notes_from_its_number(run, tmp_path, capsys):
    """A model directory without a run's record: config.json's number is all there is to go by."""
    d, data = run
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "model.safetensors"):
        (hf / name).write_bytes((d / name).read_bytes())
    assert _notes(capsys, "eval", "--model", str(hf), "--data", data, "--max_seq_length", "20",
                  "--max_batches", "1") == [
        "note: --max_seq_length: 20 is past the model's max_position_embeddings (16): positions 16-19 take RoPE "
        "angles computed as transformers computes them (RoPE has no position table), angles a model pretrained to "
        "16 has not seen"]


def test_eval_config_notes_the_positions_past_its_model(run, tmp_path, capsys):
    """`eval --config` (a run's split) printed no note at all: its windows past the evaluated model's range are
    noted as --data's are, and none when the run that wrote the model trained at that length."""
    d, data = run
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"model_name_or_path": str(d), "tokenizer_name_or_path": str(d), "input_dir": data,
                                  "output_dir": str(tmp_path / "out"), "split": "50,50,0", "max_seq_length": 20,
                                  "per_device_eval_batch_size": 1, "eval_iters": 1, "max_steps": 1}))
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json"):
        if (d / name).is_file():
            (hf / name).write_bytes((d / name).read_bytes())
    assert _notes(capsys, "eval", "--config", str(config), "--model", str(hf)) == [
        f"note: {config}: max_seq_length: 20 is past the model's max_position_embeddings (16): positions 16-19 take "
        f"RoPE angles computed as transformers computes them (RoPE has no position table), angles a model "
        f"pretrained to 16 has not seen"]
    assert _notes(capsys, "eval", "--config", str(config), "--model", str(d), "--max_seq_length", "24") == []
    notes = _notes(capsys, "eval", "--config", str(config), "--model", str(d), "--max_seq_length", "28")
    assert len(notes) == 1 and notes[0].startswith("note: --max_seq_length: 28 is past the model's "
                                                   "max_position_embeddings (16) and the 24 tokens its run trained on")


def test_generate_slides_its_window_at_the_length_its_run_trained_on(run, capsys):
    """The window slides at 24 (the run's length), not at config.json's 16: the tokens are `generate`'s with that
    window, and a note names which number it is (it said "exceeded the model's max_position_embeddings (16)")."""
    from pretrain_cli.commands.generate import _stop_ids
    from pretrain_cli.training.weight_source import load_for_inference

    d, _ = run
    tok, cfg = load_tokenizer(str(d)), ModelConfig.from_file(str(d))
    prompt = "the quick brown fox jumps over the lazy dog"
    ids = tok.encode(prompt)
    assert LIMIT < len(ids) < TRAINED  # the old window (16) cut this prompt; the run's (24) holds it
    assert main(["generate", "--model", str(d), "--prompt", prompt, "--max_new_tokens", "12", "--json"]) == 0
    out = capsys.readouterr()
    model, _ = load_for_inference(str(d), cfg, 0)
    stops = _stop_ids(d, cfg, tok)
    ref = [int(t) for t in generation.generate(model, [ids], 12, eos_token_id=stops, max_length=TRAINED)[0][len(ids):]]
    ended = [j for j, t in enumerate(ref) if t in stops]
    assert json.loads(out.out)["tokens"] == (ref[:ended[0]] if ended else ref)
    first = generation.first_slid_token(len(ids), len(ref), TRAINED)
    assert first == TRAINED - len(ids) + 2 and len(ref) == 12  # (no EOS ended it early: the window slid)
    said = [line for line in out.err.splitlines() if line.startswith("note: prompt")]
    assert "max_position_embeddings (16) from" not in out.err
    assert said == [
        f"note: prompt + generated tokens exceeded the {TRAINED} tokens its run trained on (args.json's "
        f"trained_length; config.json keeps max_position_embeddings {LIMIT}) from generated token {first} of "
        f"{len(ref)} on: from there the model saw only the last {TRAINED} tokens, a window that slid on with every "
        f"generated token"]
    assert generation.context_window(LIMIT, TRAINED)[0] == TRAINED
    assert generation.context_window(LIMIT, None) == (LIMIT, f"the model's max_position_embeddings ({LIMIT})")
    assert generation.context_window(LIMIT, 8)[0] == LIMIT  # a run shorter than the number: the number


def test_generate_on_a_prompt_past_the_runs_length_names_it(run, capsys):
    d, _ = run
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 4)
    n = len(load_tokenizer(str(d)).encode(prompt))
    assert n > TRAINED
    assert main(["generate", "--model", str(d), "--prompt", prompt, "--max_new_tokens", "1"]) == 0
    assert (f"note: --prompt is {n} tokens, more than the {TRAINED} tokens its run trained on (args.json's "
            f"trained_length; config.json keeps max_position_embeddings {LIMIT}): it saw only the last {TRAINED} "
            f"(the first {n - TRAINED} were dropped)") in capsys.readouterr().err
