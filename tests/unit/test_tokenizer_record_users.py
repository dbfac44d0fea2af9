"""The tokenizer a run without one records in its args.json (`tokenizer_lineage.trained_with`: its token files'
sidecars) judges more than a resume: eval of its final directory on token files of another tokenizer is refused (it
ran silently, where a model directory with tokenizer files refuses them); continue_training from it with such files
or another tokenizer is said (a new lineage can be meant) and carries the record forward into the new run's
args.json (as `trained_length` is); generate, which needs a tokenizer, names the recorded one."""
import json
import shutil

from test_tokenizer_resume_record import _args, _data, _said
from tokenizer_forms import gpt2_style, spaced

from pretrain_cli import cli
from pretrain_cli.data.tokenizer import load_tokenizer


def test_eval_continue_and_generate_judge_the_record_of_a_run_without_tokenizer_files(tmp_path, capsys):
    whole, _ = gpt2_style(tmp_path)
    other = spaced(tmp_path, whole)
    _data(tmp_path, {"d": whole, "d2": other})
    assert cli.main(["train", _args(tmp_path, "first")]) == 0
    out = tmp_path / "out"
    assert not (out / "tokenizer.json").exists()
    record = json.loads((out / "args.json").read_text())["tokenizer"]
    said = _said(out, record)
    fp, other_fp = load_tokenizer(whole).fingerprint[:12], load_tokenizer(other).fingerprint[:12]
    capsys.readouterr()
    # eval: another tokenizer's token files refused, naming the field and both values; its own evaluated
    assert cli.main(["eval", "--model", str(out), "--data", str(tmp_path / "d2" / "c")]) == 2
    err = capsys.readouterr().err
    assert f"error: --data: {tmp_path / 'd2' / 'c'}.json was made with another tokenizer than the one {said}: its " \
           f"tokenizer fingerprint is {other_fp}, the record's {fp}; its token ids would mean other tokens; pass " \
           f"--data made with that tokenizer" in err, err
    assert cli.main(["eval", "--model", str(out), "--data", str(tmp_path / "d" / "c")]) == 0
    # continue_training from the final directory on another tokenizer's files: said in one note
    cont = {"model_name_or_path": str(out), "continue_training": 1, "output_dir": str(tmp_path / "new"),
            "device": "cpu", "do_train": True, "max_steps": 2, "max_seq_length": 16, "split": "1",
            "per_device_train_batch_size": 1}
    (tmp_path / "cont.json").write_text(json.dumps({**cont, "input_dir": str(tmp_path / "d2")}))
    assert cli.main(["check", str(tmp_path / "cont.json")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "continue_training loads its weights" in line]
    assert notes == [f"  note: input_dir: {tmp_path / 'd2' / 'c'}.json was made with another tokenizer than the one "
                     f"{said}: its tokenizer fingerprint is {other_fp}, the record's {fp}; its token ids would mean "
                     f"other tokens: continue_training loads its weights, whose embedding rows were trained on that "
                     f"tokenizer's ids; use data made with it unless a new tokenizer is meant"], notes
    # ... or with another tokenizer (and its files, which pass the data's check): said of the tokenizer
    (tmp_path / "cont.json").write_text(json.dumps({**cont, "input_dir": str(tmp_path / "d2"),
                                                    "tokenizer_name_or_path": str(other)}))
    assert cli.main(["check", str(tmp_path / "cont.json")]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if "continue_training loads its weights" in line]
    assert notes == [f"  note: tokenizer_name_or_path: {other} is not the tokenizer {said}: its fingerprint is "
                     f"{other_fp}, the record's {fp}; its token ids would mean other tokens: continue_training loads "
                     f"its weights, whose embedding rows were trained on that tokenizer's ids; set "
                     f"tokenizer_name_or_path to that tokenizer unless a new tokenizer is meant"], notes
    # ... and on files whose sidecar names no tokenizer: the record is carried forward into the new run's
    (tmp_path / "bare").mkdir()
    for ext in (".bin", ".idx"):
        shutil.copy(tmp_path / "d" / f"c{ext}", tmp_path / "bare" / f"c{ext}")
    (tmp_path / "cont.json").write_text(json.dumps({**cont, "input_dir": str(tmp_path / "bare")}))
    assert cli.main(["check", str(tmp_path / "cont.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer"] == record
    # generate names the recorded tokenizer
    assert cli.main(["generate", "--model", str(out), "--prompt", "hello"]) == 2
    assert f"error: --model: {out} has no tokenizer files; pass --tokenizer DIR ({out} was trained with tokenizer " \
           f"{whole} (ids fingerprint {record['tokenizer_ids_fingerprint'][:12]}, fingerprint {fp}), as its " \
           f"args.json records it)" in capsys.readouterr().err
