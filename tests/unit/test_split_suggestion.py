"""The `split` that `check` names for an evaluation split too small fixes every split the run needs at once: it
named a value that fixed the valid split only, and the next `check` stopped at the test split with another."""
import json
import re

from data_helpers import write_tokens
from pretrain_cli import cli


def _check(tmp_path, capsys, n_docs: int, seq_len: int, *argv, input_dir=None) -> tuple[int, list[str]]:
    """`check` of a run that trains, evaluates (2 batches of 1 a data rank) and predicts (10 x as many batches) on
    `n_docs` documents of 64 tokens (or on `input_dir`)."""
    data = tmp_path / "data"
    prefix = input_dir or (str(data) if (data.with_suffix(".bin")).exists() else
                           write_tokens(data, n_docs=n_docs, doc_len=64))
    (tmp_path / "run.json").write_text(json.dumps({
        "model_name_or_path": "micro-llama", "input_dir": prefix, "output_dir": str(tmp_path / "out"),
        "device": "cpu", "do_train": True, "do_eval": True, "do_predict": True, "max_steps": 10,
        "max_seq_length": seq_len, "split": "949,50,1", "per_device_train_batch_size": 1,
        "per_device_eval_batch_size": 1, "eval_iters": 2, "tokenizer_name_or_path": None}))
    code = cli.main(["check", str(tmp_path / "run.json"), *argv])
    out = capsys.readouterr()
    return code, (out.out + out.err).splitlines()


def _suggested(lines: list[str]) -> str:
    found = [m.group(1) for line in lines if (m := re.search(r'set split: "([\d,]+)"', line))]
    assert len(found) == 1, lines
    return found[0]


def test_the_split_named_for_a_too_small_valid_split_also_fixes_the_test_split(tmp_path, capsys):
    """30 documents of 64 tokens in 128-token samples on 8 data ranks: the valid split (2 documents) is short of
    one sample and the test split empty; the value named gives both one, and `check` with it passes."""
    code, lines = _check(tmp_path, capsys, 30, 128, "--world_size", "8")
    assert code == 2
    assert lines[-1].endswith('set split: "832,84,84" (this source\'s valid split would then hold 1 sample and its '
                              'test split 1 sample; the run reads 16 valid and 160 test samples, so evaluation '
                              'repeats them)'), lines
    code, lines = _check(tmp_path, capsys, 30, 128, "--world_size", "8", "--split", _suggested(lines))
    assert code == 0 and lines[-1].startswith("check: OK"), lines


def test_the_split_named_gives_each_split_the_samples_the_run_reads_when_a_tenth_of_the_data_does(tmp_path, capsys):
    """400 documents in 16-token samples on 2 data ranks: an empty test split (1 in 1,000 of 400 documents); the
    test pass reads 10 x 2 batches x 2 ranks = 40 samples, which the value named holds, so no evaluation repeats."""
    code, lines = _check(tmp_path, capsys, 400, 16, "--world_size", "2")
    assert code == 2
    assert lines[-1] == (f"error: split: '949,50,1' leaves the test split empty (0 of 400 documents in "
                         f"{tmp_path / 'data'}) but do_predict needs it; set split: \"923,50,27\" (this source's "
                         f"valid split would then hold 79 samples and its test split 43 samples, the samples the run "
                         f"reads from each), or turn off do_predict"), lines
    code, lines = _check(tmp_path, capsys, 400, 16, "--world_size", "2", "--split", _suggested(lines))
    assert code == 0 and lines[-1].startswith("check: OK"), lines
    assert not [line for line in lines if "repeats samples" in line], lines


def test_the_split_named_for_a_blend_fixes_every_source_at_once(tmp_path, capsys):
    """400 documents of 64 tokens blended with 30 of 200, in 128-token samples on 8 data ranks: the test split is
    empty in the first source (1 in 1,000 of 400 documents) and one document in the second. The value named gives
    every source's valid and test split a sample (it was 943,50,7, judged on the first source only: the next check
    stopped at the second's test split, empty: 7 in 1,000 of its 30 documents), and `check` with it passes."""
    a = write_tokens(tmp_path / "a", n_docs=400, doc_len=64)
    b = write_tokens(tmp_path / "b", n_docs=30, doc_len=200)
    blend = f"1 {a} 1 {b}"
    code, lines = _check(tmp_path, capsys, 0, 128, "--world_size", "8", input_dir=blend)
    assert code == 2
    assert lines[-1].endswith('set split: "933,50,17" (every source\'s valid split would then hold at least 3 samples '
                              'and its test split at least 1 sample; the run reads 16 valid and 160 test samples, so '
                              'evaluation repeats them), or turn off do_predict'), lines
    code, lines = _check(tmp_path, capsys, 0, 128, "--world_size", "8", "--split", _suggested(lines), input_dir=blend)
    assert code == 0 and lines[-1].startswith("check: OK"), lines
    # the run's note says it as the suggestion judged it, per source by its weight's share (it said the blend's
    # "test split holds 4 samples", its sources' summed)
    said = [line.strip() for line in lines if "repeats samples" in line]
    assert said[1] == ("note: eval: the test split of the blend reads test_iters 20 (10 x eval_iters 2: the test pass "
                       "reads ten times as many batches, as PaddleNLP's run_pretrain.py) x per_device_eval_batch_size "
                       "1 x 8 data ranks = 160 samples: a gives 80 of them by its weight and holds 3 samples; b gives "
                       "80 of them by its weight and holds 1 sample, so evaluation repeats samples; even eval_iters 1 "
                       "reads 80 samples here (test_iters 10 x per_device_eval_batch_size 1 x 8 data ranks): give the "
                       "test split a larger share of `split`, or lower per_device_eval_batch_size"), said


def test_a_blend_s_sources_each_hold_their_weight_s_share_of_the_samples_read(tmp_path, capsys):
    """Two sources of 400 documents, weights 1 and 1, 16-token samples on 2 data ranks: the test pass reads 40
    samples, 20 from each source, so each test split needs 20, not 40 (the whole count, which took 27 in 1,000 of
    the data for the test split); `check` with the value named says no evaluation repeats."""
    a = write_tokens(tmp_path / "a", n_docs=400, doc_len=64)
    b = write_tokens(tmp_path / "b", n_docs=400, doc_len=64)
    code, lines = _check(tmp_path, capsys, 0, 16, "--world_size", "2", input_dir=f"1 {a} 1 {b}")
    assert code == 2
    assert lines[-1].endswith('set split: "936,50,14" (every source\'s valid split would then hold at least 79 samples '
                              'and its test split at least 23 samples, each source\'s share by its weight of the '
                              'samples the run reads), or turn off do_predict'), lines
    code, lines = _check(tmp_path, capsys, 0, 16, "--world_size", "2", "--split", _suggested(lines),
                         input_dir=f"1 {a} 1 {b}")
    assert code == 0 and lines[-1].startswith("check: OK"), lines
    assert not [line for line in lines if "repeats samples" in line], lines
