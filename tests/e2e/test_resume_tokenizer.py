"""A resume with another tokenizer than its checkpoint's, or on token files another tokenizer made: refused by
`check` and `train` in one line naming both by fingerprint (a same-sized tokenizer passed every shape check and
trained the checkpoint's embedding rows on ids that mean other tokens)."""
import json
import shutil

from e2e_helpers import write_config

from pretrain_cli.cli import main as cli_main
from pretrain_cli.data.tokenizer import load_tokenizer


def _other_tokenizer(corpus, tmp_path):
    """A tokenizer of the same 512 tokens trained on half the corpus, and the corpus's token files made with it."""
    half = tmp_path / "half.jsonl"
    lines = (corpus / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    half.write_text("\n".join(lines[: len(lines) // 2]) + "\n", encoding="utf-8")
    tok = tmp_path / "tok2"
    assert cli_main(["train-tokenizer", "--input_path", str(half), "--output_dir", str(tok), "--vocab_size",
                     "512"]) == 0
    assert cli_main(["preprocess", "--input_path", str(corpus / "corpus.jsonl"), "--output_prefix",
                     str(tmp_path / "data2" / "docs"), "--tokenizer", str(tok), "--append_eos"]) == 0
    return tok, tmp_path / "data2"


def test_a_resume_with_another_tokenizer_or_its_data_is_refused(corpus, tmp_path, capsys):
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    tok2, data2 = _other_tokenizer(corpus, tmp_path)
    was, now = load_tokenizer(corpus / "tokenizer").fingerprint[:12], load_tokenizer(tok2).fingerprint[:12]
    assert was != now and load_tokenizer(tok2).vocab_size == 512
    ckpt = tmp_path / "out" / "checkpoint-2"
    capsys.readouterr()
    for command in ("check", "train"):
        assert cli_main([command, cfg, "--max_steps", "3", "--tokenizer_name_or_path", str(tok2), "--input_dir",
                         str(data2)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(
            f"error: tokenizer_name_or_path: {tok2} (fingerprint {now}) is not the tokenizer {ckpt} was trained "
            f"with ({corpus / 'tokenizer'}, fingerprint {was}): its token ids would mean other tokens; resume with "
            f"that tokenizer, or, to start a new lineage on purpose, model_name_or_path: an export of it"), err
    # no tokenizer named: the token files' sidecars are compared with the checkpoint's
    plain = json.loads((tmp_path / "cfg.json").read_text())
    del plain["tokenizer_name_or_path"]
    (tmp_path / "plain.json").write_text(json.dumps({**plain, "input_dir": str(data2), "max_steps": 3}))
    assert cli_main(["check", str(tmp_path / "plain.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"made by another tokenizer than {ckpt} (fingerprint {now}; " in err, err
    assert f"resume with data made with checkpoint-2's tokenizer ({corpus / 'tokenizer'}, fingerprint {was})" in err
    # the refusal's new lineage, from the run's export with the other tokenizer: allowed, said in one note
    assert cli_main(["check", cfg, "--model_name_or_path", str(tmp_path / "out"), "--continue_training", "1",
                     "--output_dir", str(tmp_path / "new"), "--tokenizer_name_or_path", str(tok2), "--input_dir",
                     str(data2)]) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "whose weights continue_training loads" in line]
    assert said == [f"  note: tokenizer_name_or_path: {tok2} (fingerprint {now}) is not the tokenizer of "
                    f"{tmp_path / 'out'} (fingerprint {was}), whose weights continue_training loads: their embedding "
                    f"rows were trained on its ids, which mean other tokens here; leave tokenizer_name_or_path out "
                    f"(or set it to {tmp_path / 'out'}) unless a new tokenizer is meant"], said
    # the same tokenizer (also a copy of it formatted otherwise: another sha256, the same fingerprint), and no
    # tokenizer with the checkpoint's own data: the resume goes on
    assert cli_main(["check", cfg, "--max_steps", "3"]) == 0
    shutil.copytree(corpus / "tokenizer", tmp_path / "copy")
    spec = json.loads((tmp_path / "copy" / "tokenizer.json").read_text(encoding="utf-8"))
    (tmp_path / "copy" / "tokenizer.json").write_text(json.dumps(spec, indent=3), encoding="utf-8")
    assert cli_main(["check", cfg, "--max_steps", "3", "--tokenizer_name_or_path", str(tmp_path / "copy")]) == 0
    (tmp_path / "plain.json").write_text(json.dumps({**plain, "max_steps": 3}))
    assert cli_main(["check", str(tmp_path / "plain.json")]) == 0
    assert "resumes from" in capsys.readouterr().out


def test_a_trained_directory_given_as_model_name_or_path_alone_is_said_not_loaded(corpus, tmp_path, capsys):
    """PaddleNLP's meaning kept: the directory gives config.json; that its weights are not loaded is said."""
    cfg = write_config(tmp_path, corpus, max_steps=2, save_steps=2)
    assert cli_main(["train", cfg]) == 0
    out = tmp_path / "out"
    capsys.readouterr()
    assert cli_main(["check", cfg, "--model_name_or_path", str(out), "--output_dir", str(tmp_path / "new")]) == 0
    said = capsys.readouterr().out
    assert (f"note: model_name_or_path: {out} holds weights, which this run does not load: it builds the model from "
            f"config.json alone, at a random init; continue_training: 1 loads them") in said
    assert cli_main(["check", cfg, "--model_name_or_path", str(out), "--output_dir", str(tmp_path / "new"),
                     "--continue_training", "1"]) == 0
    assert "does not load" not in capsys.readouterr().out
