"""Relative paths in an argument file are read from the current directory (PaddleNLP's convention). Run from
elsewhere, `check` said three lines of "does not exist" / "is neither a local tokenizer directory nor a preset" /
"no token files", listing the current directory, with no word that each path is there, beside the file."""
import json

import pytest

from data_helpers import make_tokenizer, write_tokens
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target


@pytest.fixture
def project(tmp_path):
    root = tmp_path / "project"
    make_tokenizer(root / "tok")
    write_tokens(root / "data")
    (root / "cfg.json").write_text(json.dumps({
        "model_name_or_path": "micro-qwen2", "tokenizer_name_or_path": "./tok", "input_dir": "./data",
        "output_dir": "./out", "do_train": True, "max_seq_length": 16, "max_steps": 2, "split": "1,1,1",
        "device": "cpu"}))
    return root


def test_paths_that_are_beside_the_file_are_named_with_where_to_run(project, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        prepare(str(project / "cfg.json"), [], Target())
    assert e.value.lines[-1] == (
        f"{project / 'cfg.json'}: tokenizer_name_or_path, input_dir are read from the current directory "
        f"({tmp_path}), and are found from {project}: run from there, or give absolute paths")
    monkeypatch.chdir(project)
    assert prepare("cfg.json", [], Target()).tokenizer is not None  # from there the same file is whole


def test_a_file_in_a_subdirectory_or_a_runs_record_names_the_directory_above(project, tmp_path, monkeypatch):
    """configs/demo_cpu.json names ./demo/...: from the repository's root; a run's out/args.json (and
    out/checkpoint-N/args.json), which `eval --model out` reads, names the paths the run was started with."""
    (project / "configs").mkdir()
    (project / "configs" / "cfg.json").write_text((project / "cfg.json").read_text())
    (project / "out" / "checkpoint-2").mkdir(parents=True)
    (project / "out" / "checkpoint-2" / "args.json").write_text((project / "cfg.json").read_text())
    monkeypatch.chdir(tmp_path)
    for cfg in (project / "configs" / "cfg.json", project / "out" / "checkpoint-2" / "args.json"):
        with pytest.raises(UserError) as e:
            prepare(str(cfg), [], Target())
        assert e.value.lines[-1].endswith(f"are found from {project}: run from there, or give absolute paths")


def test_a_command_line_path_and_a_path_missing_beside_the_file_too_get_no_such_line(project, tmp_path, monkeypatch):
    """A path given on the command line is the current directory's: ./tok beside the file (whole there) is not named
    as found from there; a path missing beside the file too gets no such line either."""
    monkeypatch.chdir(tmp_path)
    command_line = ["--tokenizer_name_or_path", "./tok"]
    with pytest.raises(UserError) as e:
        prepare(str(project / "cfg.json"), command_line, Target())
    assert e.value.lines[-1] == (
        f"{project / 'cfg.json'}: input_dir is read from the current directory ({tmp_path}), and is found from "
        f"{project}: run from there, or give absolute paths")
    for part in project.glob("data.*"):  # (write_tokens's prefix: data.bin/.idx)
        part.unlink()
    with pytest.raises(UserError) as e:
        prepare(str(project / "cfg.json"), command_line, Target())
    assert e.value.lines[0].startswith("tokenizer_name_or_path: './tok' is neither"), e.value.lines
    assert not any("found from" in line for line in e.value.lines), e.value.lines
