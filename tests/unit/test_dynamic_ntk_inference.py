"""PaddleNLP's `rope_scaling_type: dynamic_ntk` at inference: `eval` and `generate` judge it as training does
(`models.position_checks.length_notes`, the one judgement all three share), at the length a forward reads. Within
max_position_embeddings it is plain RoPE, said in one note; past it PaddleNLP grows the rotation's base and no RoPE
here does, so pretrained weights are refused in one line naming what sets the length (they ran plain RoPE there
silently). A model without weights takes that length as its range, as `train` raises a new model's
max_position_embeddings to max_seq_length: noted, never refused (eval refused it where training it only noted)."""
import json

import pytest

from data_helpers import make_tokenizer, write_tokens
from pretrain_cli.errors import UserError
from run_helpers import model_config

TAIL = "or remove rope_scaling_type for plain RoPE at every length"
KEYS = {"rope_scaling_type": "dynamic_ntk", "rope_scaling_factor": 2.0}


def _model(tmp_path, positions: int = 16, trained: int | None = None, weights: bool = False) -> str:
    """A config.json with PaddleNLP's dynamic NTK and a tokenizer: alone (random init), or beside `weights` saved by
    `convert.save_hf`; `trained`: an args.json whose run trained at that length (past config.json's number, as a run
    continued past its range records it)."""
    from dataclasses import replace

    d = tmp_path / ("ntk_weights" if weights else "ntk")
    d.mkdir()
    cfg = replace(model_config("micro-llama"), max_position_embeddings=positions)
    if weights:
        from pretrain_cli import runtime
        from pretrain_cli.models import build_model, convert

        runtime.import_paddle().seed(0)
        convert.save_hf(build_model(cfg), cfg, str(d))
    (d / "config.json").write_text(json.dumps({**cfg.to_hf_dict(), **KEYS}))
    make_tokenizer(d)
    if trained is not None:
        (d / "args.json").write_text(json.dumps({"arguments": {"max_seq_length": trained}}))
    return str(d)


def _within(d: str, length: int) -> str:
    return (f"note: {d}/config.json: rope_scaling_type dynamic_ntk: PaddleNLP's dynamic NTK rotates as plain RoPE at "
            f"lengths up to max_position_embeddings {length}, and sequences of {length} tokens stay within it, so "
            f"plain RoPE, which runs here, is the same model (config.json keeps the key)")


def _raised(d: str, positions: int, length: int) -> str:
    """The note of a model without weights at a length past its config.json's range."""
    return (f"note: {d}/config.json: rope_scaling_type dynamic_ntk: PaddleNLP's dynamic NTK rotates as plain RoPE at "
            f"lengths up to max_position_embeddings {positions}, raised to {length} for a model without weights (as "
            f"`train` and PaddleNLP's run_pretrain raise a new model's), and sequences of {length} tokens stay within "
            f"it, so plain RoPE, which runs here, is the same model (config.json keeps the key)")


def _refusal(d: str, length: int, key: str) -> str:
    return (f"{d}/config.json: rope_scaling_type dynamic_ntk: sequences of {length} tokens reach past "
            f"max_position_embeddings 16, where PaddleNLP's dynamic NTK grows the rotation's base with the length, "
            f"which no RoPE here does; lower {key} to at most 16, {TAIL}")


def test_eval_of_a_model_without_weights_notes_dynamic_ntk_at_any_length(tmp_path, capsys):
    """No weights: the model evaluated at 32 is the one `train` would build for 32 (its range raised to 32), so
    dynamic NTK is plain RoPE there; eval refused it, where training it at 32 only noted."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.commands import eval as evaluate

    d = _model(tmp_path)
    evaluate._model_config(d, 16, "--max_seq_length")
    assert capsys.readouterr().err.splitlines()[-1] == _within(d, 16)
    evaluate._model_config(d, 32, "run.json: max_seq_length")
    assert capsys.readouterr().err.splitlines()[-1] == _raised(d, 16, 32)
    prefix = write_tokens(tmp_path / "t", n_docs=4, doc_len=64, vocab_size=300)
    code = cli_main(["eval", "--model", d, "--data", prefix, "--max_seq_length", "32", "--max_batches", "1"])
    err = capsys.readouterr().err
    assert code == 0 and _raised(d, 16, 32) in err.splitlines(), err


def test_eval_of_pretrained_weights_refuses_dynamic_ntk_past_their_range(tmp_path, capsys):
    """Weights keep the range they were trained for: within it a note, past it one line naming what set the length,
    --max_seq_length or the --config file's key (eval named --max_seq_length, which was not given)."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.commands import eval as evaluate

    d = _model(tmp_path, weights=True)
    evaluate._model_config(d, 16, "--max_seq_length")
    assert capsys.readouterr().err.splitlines()[-1] == _within(d, 16)
    with pytest.raises(UserError) as e:
        evaluate._model_config(d, 32, "run.json: max_seq_length")
    assert str(e.value) == _refusal(d, 32, "run.json: max_seq_length")
    prefix = write_tokens(tmp_path / "t", n_docs=4, doc_len=64, vocab_size=300)
    code = cli_main(["eval", "--model", d, "--data", prefix, "--max_seq_length", "16", "--max_batches", "1"])
    err = capsys.readouterr().err
    assert code == 0 and _within(d, 16) in err.splitlines(), err
    code = cli_main(["eval", "--model", d, "--data", prefix, "--max_seq_length", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.rstrip() == f"error: {_refusal(d, 32, '--max_seq_length')}"
    config = tmp_path / "run.json"  # the length from --config's file: its key is named
    config.write_text(json.dumps({"model_name_or_path": d, "output_dir": str(tmp_path / "out"), "input_dir": prefix,
                                  "max_seq_length": 32}))
    code = cli_main(["eval", "--config", str(config), "--model", d, "--data", prefix])
    err = capsys.readouterr().err
    assert code == 2 and err.rstrip().endswith(f"error: {_refusal(d, 32, f'{config}: max_seq_length')}"), err


def test_generate_judges_dynamic_ntk_at_the_longest_sequence_a_forward_reads(tmp_path, capsys):
    """The prompt and its new tokens but the last, capped where generate slides its context: within
    max_position_embeddings a note; pretrained weights whose context limit is past it (a run that trained longer)
    reached past it: refused, naming the prompt and --max_new_tokens, or the prompt alone where it reaches past by
    itself. Without weights the same lengths are noted, as `train` would build the model for them."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.data.tokenizer import load_tokenizer

    d = _model(tmp_path)
    prompt = len(load_tokenizer(d).encode("hello"))
    code = cli_main(["generate", "--model", d, "--prompt", "hello", "--max_new_tokens", "30", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert [n for n in out.err.splitlines() if "rope_scaling_type" in n] == [_within(d, 16)]  # once, at the limit
    long = "hello there " * 4  # within the context limit (64), past the range (16)
    tokens = len(load_tokenizer(d).encode(long))
    for weights in (True, False):
        where = tmp_path / f"longer{weights}"
        where.mkdir()
        d = _model(where, trained=64, weights=weights)  # the context slides at 64 tokens, past the range of 16
        code = cli_main(["generate", "--model", d, "--prompt", "hello", "--max_new_tokens", str(17 - prompt)])
        assert code == 0 and _within(d, 16) in capsys.readouterr().err.splitlines()
        code = cli_main(["generate", "--model", d, "--prompt", "hello", "--max_new_tokens", str(18 - prompt)])
        err = capsys.readouterr().err
        if not weights:
            assert code == 0 and _raised(d, 16, 17) in err.splitlines(), err
            code = cli_main(["generate", "--model", d, "--prompt", long, "--max_new_tokens", "1"])
            err = capsys.readouterr().err
            assert code == 0 and _raised(d, 16, tokens) in err.splitlines(), err
            continue
        assert code == 2 and "Traceback" not in err and "sequences of 17 tokens reach past max_position_embeddings " \
            "16" in err and err.rstrip().endswith(f"lower the prompt's tokens + --max_new_tokens - 1 to at most 16, "
                                                  f"{TAIL}"), err
        code = cli_main(["generate", "--model", d, "--prompt", long, "--max_new_tokens", "1"])
        err = capsys.readouterr().err
        assert code == 2 and 16 < tokens < 64 and f"sequences of {tokens} tokens reach past" in err
        assert err.rstrip().endswith(
            f"lower the {tokens} tokens of the prompt (only a shorter prompt helps: a forward reads the whole prompt "
            f"at any --max_new_tokens) to at most 16, {TAIL}"), err


def test_eval_of_a_model_without_weights_has_no_past_positions_note(tmp_path, capsys):
    """A model without weights is built for the length evaluated (its range raised to it, as `train` raises a new
    model's), so nothing says its positions past config.json's number were never trained on: eval printed, after the
    'raised to 32' note, 'angles a model pretrained to 16 has not seen' of a random-init model. Weights keep it."""
    from dataclasses import replace

    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.commands import eval as evaluate

    prefix = write_tokens(tmp_path / "t", n_docs=4, doc_len=64, vocab_size=300)
    plain = tmp_path / "plain"  # no rope_scaling_type: the past-positions note alone
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(replace(model_config("micro-llama"),
                                                          max_position_embeddings=16).to_hf_dict()))
    make_tokenizer(plain)
    for d in (_model(tmp_path), str(plain)):
        code = cli_main(["eval", "--model", d, "--data", prefix, "--max_seq_length", "32", "--max_batches", "1"])
        err = capsys.readouterr().err
        assert code == 0 and "past the model's max_position_embeddings" not in err, err
        assert "has not seen" not in err, err
    weights = tmp_path / "w"
    weights.mkdir()
    d = _model(weights, weights=True)
    evaluate._past_positions(replace(model_config("micro-llama"), max_position_embeddings=16), d, 32, "--x")
    assert "--x: 32 is past the model's max_position_embeddings (16)" in capsys.readouterr().err
