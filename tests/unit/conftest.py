"""Unit-test fixtures: `write_args`, a PaddleNLP Qwen2.5-0.5B argument file with keys changed, written to the
test's directory (the `plan` tests: test_plan.py, test_plan_memory_levers.py)."""
import json

import pytest

QWEN_FILE = {  # PaddleNLP llm/config/qwen/pretrain_argument_0p5b.json, memory-relevant keys
    "model_name_or_path": "Qwen/Qwen2.5-0.5B", "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
    "sharding": "stage2", "use_flash_attention": False, "max_seq_length": 1024, "max_steps": 10000,
    "save_steps": 5000, "save_total_limit": 2, "fp16": True, "fp16_opt_level": "O2", "recompute": False,
    "do_train": True,
}


@pytest.fixture
def write_args(tmp_path):
    def write(**kw):
        args = dict(QWEN_FILE, input_dir=str(tmp_path / "no-data-yet"), output_dir=str(tmp_path / "out"))
        args.update(kw)
        path = tmp_path / f"args{len(list(tmp_path.glob('args*.json')))}.json"
        path.write_text(json.dumps(args))
        return str(path)
    return write
