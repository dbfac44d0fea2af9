"""What launch.sh says a MAX_RESTART restart starts from: it said "resuming from the newest checkpoint" when
output_dir held none (the restart then starts from step 0), and the line above it, the failure's account, said step 0
rightly (`distributed/launcher/rerun.py` judges both now)."""
import json

from test_launch_script import _flaky


def test_a_restart_says_step_0_when_output_dir_holds_no_checkpoint_and_the_checkpoint_when_it_does(tmp_path):
    (tmp_path / "cfg.json").write_text(json.dumps({"output_dir": "out"}))
    out, calls = _flaky(tmp_path, "1,0", "1")
    assert out.returncode == 0 and len(calls) == 2, out.stderr
    assert "restart 1 of 1, to start from step 0 (out holds no complete checkpoint)" in out.stderr, out.stderr
    assert "newest" not in out.stderr
    (tmp_path / "out" / "checkpoint-4").mkdir(parents=True)
    out, calls = _flaky(tmp_path, "1,0", "1")
    assert "restart 1 of 1, to resume from out/checkpoint-4, the newest complete checkpoint" in out.stderr, out.stderr
