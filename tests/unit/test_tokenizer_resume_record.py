"""A resume from a checkpoint that holds no tokenizer files (its run had no tokenizer: token files and vocab_size
alone) was not checked at all: any tokenizer, or token files of any tokenizer, resumed it. The run's args.json (so
each checkpoint's) records the tokenizer its weights train with, from its token files' sidecars
(`tokenizer_lineage.trained_with`), and the resume is judged against that record by the judges of sidecars: another
tokenizer, or token files of another, is refused; the other form of the same tokenizer resumes. A checkpoint that
records none says in one warning that the tokenizer could not be checked."""
import json

from data_helpers import make_texts, run_preprocess, write_jsonl
from tokenizer_forms import gpt2_style, spaced

from pretrain_cli import cli
from pretrain_cli.data.tokenizer import load_tokenizer
from pretrain_cli.storage.checkpoint_dir import CheckpointDir
from pretrain_cli.training.tokenizer_lineage import trained_with


def _args(tmp_path, name: str, **keys) -> str:
    args = {"model_name_or_path": "micro-llama", "vocab_size": 300, "input_dir": str(tmp_path / "d"),
            "output_dir": str(tmp_path / "out"), "device": "cpu", "do_train": True, "max_steps": 2, "save_steps": 2,
            "max_seq_length": 16, "split": "1", "per_device_train_batch_size": 1, **keys}
    (tmp_path / f"{name}.json").write_text(json.dumps(args))
    return str(tmp_path / f"{name}.json")


def test_a_checkpoint_without_tokenizer_files_is_judged_by_the_tokenizer_its_run_recorded(tmp_path, capsys):
    whole, files = gpt2_style(tmp_path)
    other = spaced(tmp_path, whole)
    write_jsonl(tmp_path / "c.jsonl", make_texts(40))
    for d, tok in (("d", whole), ("d2", other)):
        assert run_preprocess("--input_path", tmp_path / "c.jsonl", "--output_prefix", tmp_path / d / "c",
                              "--tokenizer", tok, "--append_eos") == 0
    assert cli.main(["train", _args(tmp_path, "first")]) == 0  # no tokenizer: none in its checkpoint
    ckpt = tmp_path / "out" / "checkpoint-2"
    assert not (ckpt / "tokenizer.json").exists()
    sidecar = json.loads((tmp_path / "d" / "c.json").read_text())
    record = json.loads((ckpt / "args.json").read_text())["tokenizer"]
    assert record == {f: sidecar[f] for f in ("tokenizer", "tokenizer_fingerprint", "tokenizer_ids_fingerprint",
                                              "tokenizer_sha256", "vocab_size", "eos_token_id")}
    assert trained_with(None, [], CheckpointDir(ckpt)) == record  # a resume without one carries it forward
    fp = load_tokenizer(whole).fingerprint[:12]
    said = f"{ckpt} was trained with ({whole}, fingerprint {fp}, as its args.json records it): its token ids would " \
           f"mean other tokens"
    capsys.readouterr()
    # another tokenizer, with token files of its own (which pass the data's check): refused
    assert cli.main(["check", _args(tmp_path, "other", max_steps=4, tokenizer_name_or_path=str(other),
                                    input_dir=str(tmp_path / "d2"))]) == 2
    err = capsys.readouterr().err
    assert f"error: tokenizer_name_or_path: {other} (fingerprint " in err and f"is not the tokenizer {said}" in err, err
    # no tokenizer, token files of another: refused, naming the file
    assert cli.main(["check", _args(tmp_path, "files", max_steps=4, input_dir=str(tmp_path / "d2"))]) == 2
    err = capsys.readouterr().err
    assert f"error: input_dir: {tmp_path / 'd2' / 'c'}.json names another tokenizer (fingerprint " in err, err
    assert f"than the one {said}" in err, err
    # the other form of the same tokenizer (another fingerprint, the same ids): resumes, and so does the data
    assert cli.main(["check", _args(tmp_path, "form", max_steps=4, tokenizer_name_or_path=str(files))]) == 0
    assert cli.main(["check", _args(tmp_path, "same", max_steps=4)]) == 0
    assert "could not be checked" not in capsys.readouterr().out
    # a checkpoint recording no tokenizer (written before the record): one warning that it could not be checked
    meta = json.loads((ckpt / "args.json").read_text())
    del meta["tokenizer"]
    (ckpt / "args.json").write_text(json.dumps(meta))
    assert cli.main(["check", _args(tmp_path, "unrecorded", max_steps=4, tokenizer_name_or_path=str(other),
                                    input_dir=str(tmp_path / "d2"))]) == 0
    warned = [line for line in capsys.readouterr().out.splitlines() if "could not be checked" in line]
    assert warned == ["warning: resuming from checkpoint-2, which holds no tokenizer files and whose args.json records "
                      "no tokenizer (its run had none and its token files' sidecars named none, or it was written "
                      "before the record): whether this run's tokenizer (or its token files') is the one its weights "
                      "were trained with could not be checked"], warned
