"""A resume from a checkpoint that holds no tokenizer files (its run had no tokenizer: token files and vocab_size
alone) was not checked at all: any tokenizer, or token files of any tokenizer, resumed it. The run's args.json (so
each checkpoint's) records the tokenizer its weights train with, from its token files' sidecars
(`tokenizer_lineage.trained_with`), and the resume is judged against that record by the judges of sidecars: another
tokenizer, or token files of another, is refused naming the field and both values; the other form of the same
tokenizer resumes. A checkpoint that records none says in one warning that the tokenizer could not be checked. A run
with a tokenizer records it in every field (ids fingerprint and sha256 too), and a run without one that resumes a
checkpoint holding tokenizer files records those files: the record is carried forward into checkpoints without
files, where a partial one refused the other form of the same tokenizer and the first run's own data."""
import json
import shutil

from data_helpers import make_texts, run_preprocess, write_jsonl
from tokenizer_forms import gpt2_style, spaced

from pretrain_cli import cli
from pretrain_cli.data.tokenizer import load_tokenizer
from pretrain_cli.training.tokenizer_lineage import trained_with

FIELDS = ("tokenizer", "tokenizer_fingerprint", "tokenizer_ids_fingerprint", "tokenizer_sha256", "vocab_size",
          "eos_token_id")


def _args(tmp_path, name: str, **keys) -> str:
    args = {"model_name_or_path": "micro-llama", "vocab_size": 300, "input_dir": str(tmp_path / "d"),
            "output_dir": str(tmp_path / "out"), "device": "cpu", "do_train": True, "max_steps": 2, "save_steps": 2,
            "max_seq_length": 16, "split": "1", "per_device_train_batch_size": 1, **keys}
    (tmp_path / f"{name}.json").write_text(json.dumps(args))
    return str(tmp_path / f"{name}.json")


def _data(tmp_path, tokenizers: dict) -> None:
    """Token files `<dir>/c` of one corpus for each {dir: tokenizer}."""
    write_jsonl(tmp_path / "c.jsonl", make_texts(40))
    for d, tok in tokenizers.items():
        assert run_preprocess("--input_path", tmp_path / "c.jsonl", "--output_prefix", tmp_path / d / "c",
                              "--tokenizer", tok, "--append_eos") == 0


def _said(ckpt, rec: dict) -> str:
    return (f"{ckpt} was trained with (tokenizer {rec['tokenizer']} (ids fingerprint "
            f"{rec['tokenizer_ids_fingerprint'][:12]}, fingerprint {rec['tokenizer_fingerprint'][:12]}), as its "
            f"args.json records it)")


def test_a_checkpoint_without_tokenizer_files_is_judged_by_the_tokenizer_its_run_recorded(tmp_path, capsys):
    whole, files = gpt2_style(tmp_path)
    other = spaced(tmp_path, whole)
    _data(tmp_path, {"d": whole, "d2": other})
    assert cli.main(["train", _args(tmp_path, "first")]) == 0  # no tokenizer: none in its checkpoint
    ckpt = tmp_path / "out" / "checkpoint-2"
    assert not (ckpt / "tokenizer.json").exists()
    sidecar = json.loads((tmp_path / "d" / "c.json").read_text())
    record = json.loads((ckpt / "args.json").read_text())["tokenizer"]
    assert record == {f: sidecar[f] for f in FIELDS}
    assert trained_with(None, [], [ckpt]) == record  # a resume without one carries it forward
    said = _said(ckpt, record)
    fp, other_fp = load_tokenizer(whole).fingerprint[:12], load_tokenizer(other).fingerprint[:12]
    capsys.readouterr()
    # another tokenizer, with token files of its own (which pass the data's check): refused, naming the field
    assert cli.main(["check", _args(tmp_path, "other", max_steps=4, tokenizer_name_or_path=str(other),
                                    input_dir=str(tmp_path / "d2"))]) == 2
    err = capsys.readouterr().err
    assert f"error: tokenizer_name_or_path: {other} is not the tokenizer {said}: its fingerprint is {other_fp}, the " \
           f"record's {fp}; its token ids would mean other tokens; resume with that tokenizer, or" in err, err
    # no tokenizer, token files of another: refused, naming the file
    assert cli.main(["check", _args(tmp_path, "files", max_steps=4, input_dir=str(tmp_path / "d2"))]) == 2
    err = capsys.readouterr().err
    assert f"error: input_dir: {tmp_path / 'd2' / 'c'}.json was made with another tokenizer than the one {said}: its " \
           f"tokenizer fingerprint is {other_fp}, the record's {fp}; its token ids would mean other tokens" in err, err
    # the other form of the same tokenizer (another fingerprint, the same ids): resumes, and so does the data
    assert cli.main(["check", _args(tmp_path, "form", max_steps=4, tokenizer_name_or_path=str(files))]) == 0
    assert cli.main(["check", _args(tmp_path, "same", max_steps=4)]) == 0
    assert "could not be checked" not in capsys.readouterr().out
    # a sidecar that names no tokenizer but another EOS id: refused naming that field and both values (it was
    # refused as naming 'another tokenizer (tokenizer.json sha256 None)')
    (tmp_path / "d3").mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(tmp_path / "d" / f"c{ext}", tmp_path / "d3" / f"c{ext}")
    (tmp_path / "d3" / "c.json").write_text(json.dumps({**{k: v for k, v in sidecar.items() if k not in FIELDS},
                                                        "vocab_size": 300, "eos_token_id": 7}))
    assert cli.main(["check", _args(tmp_path, "eos", max_steps=4, input_dir=str(tmp_path / "d3"))]) == 2
    err = capsys.readouterr().err
    assert f"error: input_dir: {tmp_path / 'd3' / 'c'}.json was made with another tokenizer than the one {said}: its " \
           f"eos_token_id is 7, the record's {record['eos_token_id']}; its token ids" in err, err
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


def test_the_record_carried_past_a_checkpoint_with_tokenizer_files_is_whole(tmp_path, capsys):
    """Run 1 trains with GPT-2's vocab.json + merges.txt form on data made with its tokenizer.json form (one
    tokenizer: its ids fingerprint says so); run 2 resumes it without a tokenizer on the same files without their
    sidecar, so its checkpoint holds no tokenizer files and records what checkpoint-2's files are. Resuming that
    with the tokenizer.json form, or without a tokenizer on run 1's own data, was refused (run 1's record, carried
    forward, had no ids fingerprint); another tokenizer still is."""
    whole, files = gpt2_style(tmp_path)
    _data(tmp_path, {"d": whole})
    assert cli.main(["train", _args(tmp_path, "first", tokenizer_name_or_path=str(files))]) == 0
    ckpt2 = tmp_path / "out" / "checkpoint-2"
    tok = load_tokenizer(files)
    want = {"tokenizer": str(files), "tokenizer_fingerprint": tok.fingerprint,
            "tokenizer_ids_fingerprint": tok.ids_fingerprint, "tokenizer_sha256": tok.sha256,
            "vocab_size": tok.vocab_size, "eos_token_id": tok.eos_token_id}
    assert json.loads((ckpt2 / "args.json").read_text())["tokenizer"] == want  # every field, files or not
    (tmp_path / "bare").mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(tmp_path / "d" / f"c{ext}", tmp_path / "bare" / f"c{ext}")
    assert cli.main(["train", _args(tmp_path, "second", max_steps=4, input_dir=str(tmp_path / "bare"))]) == 0
    ckpt4 = tmp_path / "out" / "checkpoint-4"
    assert not (ckpt4 / "tokenizer.json").exists()
    # what checkpoint-2's files are (its tokenizer.json: the form it loaded, written out, so its own bytes)
    want = {**want, "tokenizer_sha256": load_tokenizer(ckpt2).sha256}
    assert json.loads((ckpt4 / "args.json").read_text())["tokenizer"] == want
    meta = json.loads((ckpt2 / "args.json").read_text())
    del meta["tokenizer"]  # a checkpoint with files and no record (written before it): its files still tell
    (ckpt2 / "args.json").write_text(json.dumps(meta))
    assert trained_with(None, [str(tmp_path / "bare" / "c")], [None, ckpt2]) == want
    capsys.readouterr()
    assert cli.main(["check", _args(tmp_path, "json_form", max_steps=6, tokenizer_name_or_path=str(whole))]) == 0
    assert cli.main(["check", _args(tmp_path, "own_data", max_steps=6)]) == 0
    other = spaced(tmp_path, whole)
    assert cli.main(["check", _args(tmp_path, "other", max_steps=6, tokenizer_name_or_path=str(other))]) == 2
    assert f"is not the tokenizer {_said(ckpt4, want)}: its fingerprint is" in capsys.readouterr().err


def test_only_rank_0_takes_the_record_and_its_ids_fingerprint(tmp_path, monkeypatch):
    """The record (`spec.record()`) was taken on every rank though only rank 0 writes args.json: for data whose
    sidecars do not record the ids fingerprint, each rank of a node parsed the whole tokenizer for it (R4: 2.7 s
    each for a Qwen-size one at load 4.5, 8 ranks). Rank 0 computes it, once; another rank takes no record."""
    from pretrain_cli.data import tokenizer as tokenizer_module
    from pretrain_cli.orchestration.prepare import prepare
    from pretrain_cli.run_config import Target
    from pretrain_cli.training.run import args_record

    whole, _ = gpt2_style(tmp_path)
    _data(tmp_path, {"d": whole})
    sidecar = json.loads((tmp_path / "d" / "c.json").read_text())
    del sidecar["tokenizer_ids_fingerprint"]  # (a sidecar from before it)
    (tmp_path / "d" / "c.json").write_text(json.dumps(sidecar))
    config = _args(tmp_path, "run", tokenizer_name_or_path=str(whole))
    parsed, original = [], tokenizer_module.ids_form
    monkeypatch.setattr(tokenizer_module, "ids_form", lambda spec: parsed.append(1) or original(spec))
    other = prepare(config, [], Target(device="cpu", world_size=2, rank=1))
    assert not other.run.parallel.is_rank0 and args_record(other) is None and parsed == []
    rank0 = prepare(config, [], Target(device="cpu", world_size=2, rank=0))
    record = args_record(rank0)["tokenizer"]
    assert parsed == [1]  # (prepare's data check had no need of it: the sidecar's fingerprint is the tokenizer's)
    assert record["tokenizer_ids_fingerprint"] == load_tokenizer(whole).ids_fingerprint
