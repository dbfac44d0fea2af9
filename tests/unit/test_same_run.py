"""Every rank of a launch runs the same run in the same output_dir (`training.same_run`), checked once the group is
joined: a node started with another max_seq_length, model or token files, or writing its own output_dir, stops every
rank with one line naming it (they trained silently on mixed data, or met a 30 s gloo timeout or a hang verdict).
The ranks are threads over an in-memory stand-in of the launcher's TCP store."""
import json
import shutil
import threading
from pathlib import Path

import pytest

from data_helpers import write_tokens
from pretrain_cli.distributed.comms.comm import Comm
from pretrain_cli.errors import UserError
from pretrain_cli.orchestration.prepare import prepare
from pretrain_cli.run_config import Target
from pretrain_cli.training import run_lock, same_run


class Store:
    """The TCP store's set / blocking get / add."""

    def __init__(self):
        self.values, self.cond = {}, threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.values[key] = value
            self.cond.notify_all()

    def get(self, key):
        with self.cond:
            assert self.cond.wait_for(lambda: key in self.values, timeout=60), key
            return self.values[key]

    def add(self, key, n):
        with self.cond:
            self.values[key] = self.values.get(key, 0) + n
            return self.values[key]


def _threads(world: int, work):
    """`work(comm, rank)` on one thread per rank over one store; each rank's outcome: what it returned, or its error
    line."""
    store, outcome = Store(), {}

    def rank(r):
        comm = Comm(r, world)
        comm._store = lambda: store
        try:
            outcome[r] = work(comm, r)
        except UserError as e:
            outcome[r] = str(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return [outcome[r] for r in range(world)]


def _ranks(fingerprints, output_dirs):
    """Run `same_run.check` on one thread per rank; each rank's outcome: None, or its error line."""
    return _threads(len(fingerprints), lambda comm, r: same_run.check(comm, fingerprints[r], output_dirs[r]))


def _tokens(directory, **kw):
    directory.mkdir(parents=True)
    write_tokens(directory / "corpus", **kw)


def _spec(tmp_path, data, out, *more, world: int = 2, rank: int = 0):
    return prepare(None, ["--model_name_or_path", "micro-qwen2", "--input_dir", str(data), "--output_dir", str(out),
                          "--do_train", "--max_steps", "5", "--max_seq_length", "16", "--split", "98,2,0",
                          "--device", "cpu", *more], Target("cpu", world, rank, rank))


@pytest.fixture
def lock(tmp_path):
    """Rank 0's run lock in `tmp_path/out` (taken before joining, as `training.run.run` does)."""
    held = run_lock.acquire(tmp_path / "out")
    yield tmp_path / "out"
    held.release()


def test_the_same_run_on_other_mounts_passes_on_every_rank(tmp_path, lock):
    _tokens(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")  # the same token files under another path (another mount)
    first, other = _spec(tmp_path, tmp_path / "a", lock), _spec(tmp_path, tmp_path / "b", tmp_path / "elsewhere")
    assert first.fingerprint() == other.fingerprint()
    same = first.fingerprint()
    assert _ranks([same, same, same], [lock, lock, lock]) == [None, None, None]


def test_another_configuration_on_one_node_stops_every_rank_with_the_keys_that_differ(tmp_path, lock):
    _tokens(tmp_path / "a")
    _tokens(tmp_path / "c", n_docs=41)  # other token files
    first = _spec(tmp_path, tmp_path / "a", lock).fingerprint()
    seq = _spec(tmp_path, tmp_path / "a", lock, "--max_seq_length", "32").fingerprint()
    data = _spec(tmp_path, tmp_path / "c", lock).fingerprint()
    lines = _ranks([first, first, seq], [lock] * 3)
    assert lines[0] == lines[1] == lines[2] and lines[0].startswith(
        "rank 2 (host "), lines  # every rank: the same line, naming the rank that differs
    assert "runs another configuration than rank 0 (host " in lines[0]
    assert ": max_seq_length 32 (rank 0: 16); start every node with the same argument file" in lines[0]
    line = _ranks([first, data], [lock] * 2)[0]
    assert "token files 'corpus weight 1.000: 41 documents, 2624 tokens (uint16)' (rank 0: 'corpus weight 1.000: " \
           "40 documents, 2560 tokens (uint16)')" in line, line
    layers = _spec(tmp_path, tmp_path / "a", lock, "--num_hidden_layers", "3").fingerprint()
    line = _ranks([first, layers], [lock] * 2)[1]
    assert "num_hidden_layers 3 (rank 0: unset); model config.json: num_hidden_layers 3 (rank 0: 2)" in line, line


def test_an_output_dir_that_is_not_shared_stops_every_rank_naming_both_directories(tmp_path, lock, monkeypatch):
    monkeypatch.setattr(same_run, "SEE_SECONDS", 0.0)  # (a shared file system's lag is waited for up to 10 s)
    _tokens(tmp_path / "a")
    fp = _spec(tmp_path, tmp_path / "a", lock).fingerprint()
    own = tmp_path / "node1" / "out"  # node 1's own disk, the same path there
    own.mkdir(parents=True)
    lines = _ranks([fp, fp], [lock, own])
    assert lines[0] == lines[1], lines
    assert lines[0].startswith(f"output_dir: rank 1 (host ") and f"sees no run lock in {own}/run.lock, not the one " \
        f"rank 0" in lines[0] and f"holds in {lock}/run.lock: the nodes do not share output_dir" in lines[0], lines
    (own / "run.lock").write_text(json.dumps({"host": "node9", "pid": 12, "started": "then", "beat": 3}))
    line = _ranks([fp, fp], [lock, own])[0]
    assert "sees another run's lock (pid 12 on host node9) in" in line, line


def test_one_process_checks_nothing(tmp_path):
    class One:
        world, rank = 1, 0

    same_run.check(One(), {"a": 1}, tmp_path)  # no store to ask


def _checkpoint(spec, step: int):
    """`checkpoint-<step>` of `spec`'s run in its output_dir, complete by `storage.intact` (one process's files from
    before the index: what a resume's decisions read, its args.json, config.json and trainer state, is real)."""
    import numpy as np

    from pretrain_cli.storage.shard_files import write

    ckpt = Path(spec.run.output.output_dir) / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "args.json").write_text(json.dumps(spec.record(), default=str))
    (ckpt / "config.json").write_text(json.dumps(spec.model_cfg.to_hf_dict()))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "consumed_samples": step * 2}))
    ones = np.ones((4, 4), np.float32)
    for name in ("model.safetensors", "optimizer.safetensors"):
        write(ckpt / name, [("w", "F32", ones.shape, lambda: ones)])
    return ckpt


HARMS = {"optimizer.safetensors truncated": lambda c: (c / "optimizer.safetensors").write_bytes(
             (c / "optimizer.safetensors").read_bytes()[:-4]),
         "config.json deleted": lambda c: (c / "config.json").unlink()}


@pytest.mark.parametrize("harm", sorted(HARMS))
def test_ranks_resume_rank_0s_checkpoint_as_rank_0_does_when_it_skipped_a_damaged_newest(tmp_path, lock, harm):
    """checkpoint-2 of one process (1 x acc 2), checkpoint-4 of two (the same file: acc 1 kept the 2 sequences a
    step), damaged; the same file again on two processes. Rank 0 skips checkpoint-4 and resumes checkpoint-2 on
    another number of data ranks: acc 1. The other ranks took checkpoint-4 unverified, on as many data ranks: acc
    2, and the fingerprint's arguments differed (`gradient_accumulation_steps 2 (rank 0: 1)`: the launch refused);
    a config.json missing from it stopped them in prepare. Now they choose none before joining and take rank 0's
    checkpoint and decisions after the check."""
    _tokens(tmp_path / "a")
    spec = lambda world, rank: _spec(tmp_path, tmp_path / "a", lock, "--per_device_train_batch_size", "1",  # noqa: E731
                                     "--gradient_accumulation_steps", "2", world=world, rank=rank)
    _checkpoint(spec(1, 0), 2)
    two = spec(2, 0)
    assert (two.resume.name, two.run.loop.grad_accum, two.run.global_batch_size) == ("checkpoint-2", 1, 2)
    HARMS[harm](_checkpoint(two, 4))
    specs = [spec(2, 0), spec(2, 1)]

    def joined(comm, r):  # as `training.run` does once the group is joined
        same_run.check(comm, specs[r].fingerprint(), lock)
        return same_run.resume(comm, specs[r])

    outcome = _threads(2, joined)
    assert not any(isinstance(o, str) for o in outcome), outcome
    for r in range(2):
        run = outcome[r].run
        assert (outcome[r].resume.name, run.loop.grad_accum, run.global_batch_size) == ("checkpoint-2", 1, 2), r
        assert outcome[r].record()["arguments"] == outcome[0].record()["arguments"]
        assert [n for n in run.notes if n.startswith("batch:")] == [
            "batch: checkpoint-2 was trained on 1 x acc 2 x 1 data rank = 2 sequences a step; this run has 2 "
            "data ranks: gradient_accumulation_steps 2 -> 1 keeps 2 sequences a step"]


@pytest.mark.parametrize("layout", [(), ("--pipeline_parallel_degree", "2")], ids=["dp", "pp2"])
def test_a_resume_on_the_processes_of_the_last_resume_keeps_the_global_batch(tmp_path, lock, layout):
    """1 data rank x 1 x acc 2 (eval_iters 2) saves checkpoint-2; the same file on 2 data ranks keeps 2 sequences a
    step with acc 1 (and the eval windows with eval_iters 1) and saves checkpoint-4; the same file on those 2 data
    ranks again (a MAX_RESTART, a re-run) keeps acc 1 and eval_iters 1 on every rank. Before, checkpoint-4's args.json held only the derived acc 1, so the file's 2 counted as the user's new
    choice: 'this run takes 4 from here on'. Under a pipeline (2 stages: 2 then 4 processes) the same. A batch key the
    user does change is theirs; a checkpoint from before `user_arguments` reads its derived acc from its notes."""
    _tokens(tmp_path / "a")
    pp = 2 if layout else 1
    spec = lambda world, rank, *more: _spec(tmp_path, tmp_path / "a", lock, "--per_device_train_batch_size", "1",  # noqa: E731
                                            "--gradient_accumulation_steps", "2", "--do_eval", "true", "--eval_iters",
                                            "2", *layout, *more, world=world * pp,
                                            rank=rank)
    _checkpoint(spec(1, 0), 2)
    two = spec(2, 0)
    assert (two.resume.name, two.run.loop.grad_accum, two.run.global_batch_size) == ("checkpoint-2", 1, 2)
    four = _checkpoint(two, 4)
    specs = [spec(2, r) for r in range(2 * pp)]

    def joined(comm, r):  # as `training.run` does once the group is joined
        same_run.check(comm, specs[r].fingerprint(), lock)
        return same_run.resume(comm, specs[r])

    outcome = _threads(2 * pp, joined)
    assert not any(isinstance(o, str) for o in outcome), outcome
    for r, again in enumerate(outcome):
        assert (again.resume.name, again.run.loop.grad_accum, again.run.global_batch_size) == ("checkpoint-4", 1, 2), r
        assert [n for n in again.run.notes if n.startswith("batch:")] == [
            "batch: checkpoint-4 was trained on 1 x acc 1 x 2 data ranks = 2 sequences a step, kept from a run on "
            "another number of data ranks with these batch keys: gradient_accumulation_steps 2 -> 1 keeps 2 "
            "sequences a step"], again.run.notes
        assert again.run.loop.eval_iters == 1 and "eval: eval_iters 2 -> 1 keeps the" in " ".join(again.run.notes)
        assert again.record()["user_arguments"]["gradient_accumulation_steps"] == 2
        assert again.record()["arguments"]["gradient_accumulation_steps"] == 1
    changed = spec(2, 0, "--gradient_accumulation_steps", "4")  # the user's own change: theirs, said
    assert (changed.run.loop.grad_accum, changed.run.global_batch_size) == (4, 8)
    assert "this run takes 8 from here on" in " ".join(changed.run.notes)
    record = json.loads((four / "args.json").read_text())
    del record["user_arguments"]  # as written before: only the derived acc, and the note that derived it
    (four / "args.json").write_text(json.dumps(record))
    old = spec(2, 0)
    assert (old.resume.name, old.run.loop.grad_accum, old.run.global_batch_size, old.run.loop.eval_iters) == (
        "checkpoint-4", 1, 2, 1)


def test_training_from_a_runs_args_json_reads_what_its_user_set(tmp_path, lock):
    """A run's args.json passed as the argument file of `train` (or `check`, `plan`): 1 data rank x acc 2 saves
    checkpoint-2, 2 data ranks keep 2 sequences a step with acc 1 and save checkpoint-4, whose args.json holds the
    derived acc 1 in `arguments` and the user's 2 in `user_arguments`. Training from that file on 1 data rank read
    `arguments`: the derived acc 1 counted as the user's change and the global batch halved ('this run takes 1 from
    here on'). It reads `user_arguments`, with a note, and keeps 2 sequences a step; `eval` and `inspect-data`
    (`record="arguments"`) read what the run took."""
    from pretrain_cli.config.parser import parse_config

    _tokens(tmp_path / "a")
    spec = lambda world: _spec(tmp_path, tmp_path / "a", lock, "--per_device_train_batch_size", "1",  # noqa: E731
                               "--gradient_accumulation_steps", "2", world=world)
    _checkpoint(spec(1), 2)
    four = _checkpoint(spec(2), 4)
    record = str(four / "args.json")
    again = prepare(record, [], Target("cpu", 1, 0, 0))
    assert (again.resume.name, again.run.loop.grad_accum, again.run.global_batch_size) == ("checkpoint-4", 2, 2)
    assert not any("from here on" in n for n in again.run.notes), again.run.notes
    assert f"{record}: a run's record: its user_arguments are read (the keys as that run's user set them), not its " \
           f"arguments (gradient_accumulation_steps 1: what its resume derived)" in again.run.notes
    assert parse_config(record).training.gradient_accumulation_steps == 1  # (eval's, inspect-data's reading)
    assert prepare(record, [], Target("cpu", 1, 0, 0), {"do_train": False, "do_eval": True},
                   record="arguments").args.training.gradient_accumulation_steps == 1
