"""benchmarks/kernel_ab.py: one kernel-table entry on and off in one process, alternated, and its ratio."""
import contextlib
import io
import json

import pytest

from bench_scripts import load


def test_the_pair_ratio_is_off_over_on_per_adjacent_pair():
    kab = load("kernel_ab")
    r = kab.pair_ratios([1.0, 2.0, 1.0], [1.1, 1.8, 1.2])
    assert r["pair_ratio_median"] == 1.1 and r["pairs_faster_with"] == 2 and r["pairs"] == 3
    assert (r["with_ms"], r["without_ms"]) == (1000.0, 1200.0)


@pytest.mark.parametrize("entry", ["mlp_in", "add_rms_norm", "attn_in", "linear_residual", "linear_add_rms_norm",
                                   "embedding"])
def test_a_run_switches_the_entry_off_in_every_layer_and_reports_both(tmp_path, monkeypatch, entry):
    """A tiny model, 2 pairs: the B steps really run without the entry (the model's own table is untouched)."""
    kab = load("kernel_ab")
    cfg = json.loads((kab.HERE / "configs" / "bench.json").read_text())
    cfg["model"].update(hidden_size=32, intermediate_size=40, vocab_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2)
    cfg["arguments"].update(per_device_train_batch_size=2, max_seq_length=16)
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(cfg))
    seen = []
    real = kab.build_our_step

    def spy(*args):
        trainer, *rest = real(*args)
        mlp = trainer.raw_model.model.layers[0].mlp
        forward = type(mlp).forward
        monkeypatch.setattr(type(mlp), "forward",
                            lambda self, x, **kw: seen.append(self.kernels.mlp_in is not None)
                            or forward(self, x, **kw))
        return (trainer, *rest)

    monkeypatch.setattr(kab, "build_our_step", spy)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        args = ["--config", str(path), "--entry", entry, "--pairs", "2", "--warmup", "1", "--threads", "1"]
        assert kab.main(args) == 0
    assert f"{entry} on " in out.getvalue() and "of 2" in out.getvalue()
    if entry == "mlp_in":  # warm-up on, off; then pairs ABBA: on, off, off, on (two layers each)
        assert seen == [x for x in (True, False, True, False, False, True) for _ in range(2)]
