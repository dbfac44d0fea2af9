"""PaddleNLP's `rope_scaling_type: dynamic_ntk` at inference: `eval` and `generate` judge it as training does
(`models.config_checks.paddlenlp_rope_note`), at the length a forward reads. Within max_position_embeddings it is
plain RoPE, said in one note; past it PaddleNLP grows the rotation's base and no RoPE here does, so one line refuses,
naming what sets the length (they ran plain RoPE there silently)."""
import json

import pytest

from data_helpers import make_tokenizer, write_tokens
from pretrain_cli.errors import UserError
from run_helpers import model_config

TAIL = "or remove rope_scaling_type for plain RoPE at every length"


def _model(tmp_path, positions: int = 16, trained: int | None = None) -> str:
    """A config.json alone (random init) with PaddleNLP's dynamic NTK and a tokenizer; `trained`: an args.json whose
    run trained at that length (past config.json's number, as a run continued past its range records it)."""
    d = tmp_path / "ntk"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**model_config("micro-llama").to_hf_dict(),
                                               "max_position_embeddings": positions,
                                               "rope_scaling_type": "dynamic_ntk", "rope_scaling_factor": 2.0}))
    make_tokenizer(d)
    if trained is not None:
        (d / "args.json").write_text(json.dumps({"arguments": {"max_seq_length": trained}}))
    return str(d)


def test_eval_notes_dynamic_ntk_within_the_range_and_refuses_past_it(tmp_path, capsys):
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.commands import eval as evaluate

    d = _model(tmp_path)
    evaluate._model_config(d, 16, "--max_seq_length")
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"note: {d}/config.json: rope_scaling_type dynamic_ntk: PaddleNLP's dynamic NTK rotates as plain RoPE at "
        f"lengths up to max_position_embeddings 16, and sequences of 16 tokens stay within it, so plain RoPE, which "
        f"runs here, is the same model (config.json keeps the key)")
    with pytest.raises(UserError) as e:
        evaluate._model_config(d, 32, "run.json: max_seq_length")
    assert str(e.value) == (
        f"{d}/config.json: rope_scaling_type dynamic_ntk: sequences of 32 tokens reach past max_position_embeddings "
        f"16, where PaddleNLP's dynamic NTK grows the rotation's base with the length, which no RoPE here does; lower "
        f"run.json: max_seq_length to at most 16, {TAIL}")
    prefix = write_tokens(tmp_path / "t", n_docs=4, doc_len=64, vocab_size=300)
    code = cli_main(["eval", "--model", d, "--data", prefix, "--max_seq_length", "32"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.rstrip().endswith(
        f"lower --max_seq_length to at most 16, {TAIL}"), err


def test_generate_judges_dynamic_ntk_at_the_longest_sequence_a_forward_reads(tmp_path, capsys):
    """The prompt and its new tokens but the last, capped where generate slides its context: within
    max_position_embeddings a note; a context limit past it (a run that trained longer) reached: refused, naming the
    prompt and --max_new_tokens, or the prompt alone where it reaches past by itself."""
    from pretrain_cli.cli import main as cli_main
    from pretrain_cli.data.tokenizer import load_tokenizer

    d = _model(tmp_path)
    prompt = len(load_tokenizer(d).encode("hello"))
    code = cli_main(["generate", "--model", d, "--prompt", "hello", "--max_new_tokens", "30", "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert [n for n in out.err.splitlines() if "rope_scaling_type" in n] == [  # once, at the limit (16)
        f"note: {d}/config.json: rope_scaling_type dynamic_ntk: PaddleNLP's dynamic NTK rotates as plain RoPE at "
        f"lengths up to max_position_embeddings 16, and sequences of 16 tokens stay within it, so plain RoPE, which "
        f"runs here, is the same model (config.json keeps the key)"]
    longer = tmp_path / "longer"
    longer.mkdir()
    d = _model(longer, trained=64)  # the context slides at 64 tokens, past the range of 16
    code = cli_main(["generate", "--model", d, "--prompt", "hello", "--max_new_tokens", str(17 - prompt)])
    assert code == 0 and "sequences of 16 tokens stay within it" in capsys.readouterr().err
    code = cli_main(["generate", "--model", d, "--prompt", "hello", "--max_new_tokens", str(18 - prompt)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "sequences of 17 tokens reach past max_position_embeddings 16" \
        in err and err.rstrip().endswith(f"lower the prompt's tokens + --max_new_tokens - 1 to at most 16, {TAIL}"), err
    long = "hello there " * 4  # within the context limit (64), past the range (16)
    tokens = len(load_tokenizer(d).encode(long))
    code = cli_main(["generate", "--model", d, "--prompt", long, "--max_new_tokens", "1"])
    err = capsys.readouterr().err
    assert code == 2 and 16 < tokens < 64 and f"sequences of {tokens} tokens reach past" in err
    assert err.rstrip().endswith(
        f"lower the {tokens} tokens of the prompt (only a shorter prompt helps: a forward reads the whole prompt at "
        f"any --max_new_tokens) to at most 16, {TAIL}"), err
