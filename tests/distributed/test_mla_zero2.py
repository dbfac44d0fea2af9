"""DeepSeek-V2's shape (`micro-deepseek-v2`: MLA, greedy softmax routing with a sequence-level balance loss, no
multi-token prediction) on the semi-auto engine's ZeRO-2 over two data ranks, through the real launcher, equal to
one process step by step. Its loss is a 0-d distributed tensor whose local value Paddle 3.3.1 gives the shape [1]
(Qwen3-MoE's comes 0-d), which the step's host read (`SemiAuto.to_host`) must still hand over as a scalar:
before, `float()` of it ended rank 0 at step 1 ("only 0-dimensional arrays can be converted")."""
from launch_helpers import assert_close_losses, launch, single, write_config

STEPS = 3


def test_deepseek_v2_zero2_matches_one_process(corpus, tmp_path):
    over = dict(model_name_or_path="micro-deepseek-v2", max_steps=STEPS)
    ref = single(write_config(tmp_path / "one.json", corpus, tmp_path / "one", per_device_train_batch_size=8, **over),
                 tmp_path / "one_log")
    assert ref.returncode == 0, ref.explain()
    run = launch(write_config(tmp_path / "z2.json", corpus, tmp_path / "z2", sharding="stage2", **over),
                 tmp_path / "z2_log")
    assert run.returncode == 0, run.explain()
    assert "semi-auto" in run.log(0)
    assert_close_losses(run.losses(0), ref.losses(0), range(1, STEPS + 1))
