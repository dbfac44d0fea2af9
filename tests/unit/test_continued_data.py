"""`continue_training` from a run's directory on that run's input_dir, split and seed starts at sample 0 and so
reads, from its first step, what the source run read from its first: one note says so and what changes it, where
nothing did. Another seed (or other data) reads other samples, and gets no note."""
import os
import shutil

import pytest

from data_helpers import write_tokens
from pretrain_cli import cli
from pretrain_cli.config.presets import resolve_model_dir

RUN = ["--do_train", "--device", "cpu", "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--split", "90,5,5",
       "--disable_tqdm", "true"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """(started, output_dir): a 2-step run (4 samples) started in `started`, naming its data relatively."""
    root = tmp_path_factory.mktemp("continued")
    started, out = root / "repo", root / "runs" / "tiny"
    (started / "data").mkdir(parents=True)
    shutil.copytree(resolve_model_dir("micro-qwen2"), started / "model")
    write_tokens(started / "data" / "c", n_docs=40, doc_len=64, vocab_size=64)
    before = os.getcwd()
    os.chdir(started)
    try:
        assert cli.main(["train", "--model_name_or_path", "./model", "--input_dir", "./data/c", *RUN,
                         "--max_steps", "2", "--output_dir", str(out)]) == 0
    finally:
        os.chdir(before)
    return started, out


def _notes(source, tmp_path, capsys, *argv, data=None) -> list[str]:
    """check's notes of a continue_training run from the source's directory, on its token files named absolutely
    (from another directory than the source run's) unless `data` names them."""
    started, out = source
    code = cli.main(["check", "--model_name_or_path", str(out), "--continue_training", "1",
                     "--input_dir", data or str(started / "data" / "c"), *RUN, "--max_steps", "2",
                     "--output_dir", str(tmp_path / "next"), *argv])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    return [line.strip() for line in lines if "continue_training: the token files" in line]


def test_the_source_runs_data_split_and_seed_are_said(source, tmp_path, capsys):
    _, out = source
    assert _notes(source, tmp_path, capsys) == [
        f"note: continue_training: the token files (if unchanged since), train documents and seed are those of the "
        f"run that wrote {out} (its args.json), with its max_seq_length and sample_mode, and a continued run starts "
        f"at sample 0: from its first step this run reads the same samples in the same order as that run did from "
        f"its first (it trained on the first 4 samples); set another seed to read them in another order, or resume "
        f"that run instead (its command with a higher max_steps, in its output_dir) to go on where its data stopped"]


@pytest.mark.parametrize("named", ["./data", "data/c", "1 ./data/c"])
def test_the_same_token_files_named_otherwise_are_told(source, tmp_path, capsys, monkeypatch, named):
    """The source named `./data/c` from `started`; its directory (which holds only c), the prefix without `./`
    and a one-source blend are the same samples: input_dir is judged as the data reader parses it."""
    monkeypatch.chdir(source[0])
    assert len(_notes(source, tmp_path, capsys, data=named)) == 1


def test_a_split_that_leaves_train_its_documents_is_told(source, tmp_path, capsys):
    """90,5,5 and 90,10,0 give train the same 36 of the 40 documents: the same samples."""
    assert len(_notes(source, tmp_path, capsys, "--split", "90,10,0")) == 1


@pytest.mark.parametrize("change", [["--seed", "7"], ["--split", "80,10,10"], ["--max_seq_length", "16"]])
def test_another_seed_train_split_or_sample_length_reads_other_samples_and_is_not_told(source, tmp_path, capsys,
                                                                                      change):
    """Another max_seq_length cuts the same documents into other samples, whose order (a permutation of their
    number) is another: nothing is read again in the source's order."""
    assert _notes(source, tmp_path, capsys, *change) == []
