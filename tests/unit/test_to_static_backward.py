"""`to_static: true`: the loss's backward runs back through Paddle's compiled program, and what fails there is one line
naming to_static and what to do, as a failure of the compiled forward is (`ops.compiled_forward.CompiledBackward`,
wrapped around the precision object by `training.run.lay_out`). Before, only the forward was wrapped: a backward
failure ended the run with Paddle's traceback."""
import json

import pytest
from data_helpers import write_tokens

from pretrain_cli import runtime

paddle = runtime.import_paddle()

from pretrain_cli import cli  # noqa: E402
from pretrain_cli.errors import UserError  # noqa: E402
from pretrain_cli.ops.compiled_forward import CompiledBackward, compile_forward  # noqa: E402
from pretrain_cli.training.precision import Fp32  # noqa: E402

# what the forwards import lazily, imported before any trace (test_to_static: pytest's import hook fails inside SOT)
from pretrain_cli.ops import fp32, linear_loss_layer, tensors  # noqa: E402,F401

PADDLE_SAYS = "(PreconditionNotMet) run_program_grad: the compiled program's backward failed"


class _Raises(paddle.autograd.PyLayer):
    """Identity forward; its backward raises as a failing op of the compiled program's backward would."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError(PADDLE_SAYS)


class _Model(paddle.nn.Layer):
    def __init__(self):
        super().__init__()
        self.linear = paddle.nn.Linear(4, 4)

    def forward(self, x):
        return _Raises.apply(self.linear(x) * 2.0 + 1.0).mean()


def test_a_failure_in_the_backward_of_a_compiled_forward_is_one_line_naming_to_static():
    loss = compile_forward(_Model())(paddle.ones([3, 4]))
    with pytest.raises(UserError) as got:
        CompiledBackward(Fp32()).backward(loss)
    line = str(got.value)
    assert "\n" not in line and line.startswith("to_static: Paddle's compiled backward failed (")
    assert PADDLE_SAYS in line and line.endswith("set to_static false to train eagerly (same losses; --debug shows "
                                                 "the traceback)")
    assert got.value.__cause__ is not None  # the traceback --debug prints


def test_what_is_not_to_statics_passes_unchanged_and_the_rest_is_the_precision_objects():
    class Amp(Fp32):
        loss_scaling = True

        def __init__(self, error):
            self.error = error

        def backward(self, loss):
            raise self.error

    for error in (MemoryError("(ResourceExhausted) out of memory"), UserError("a user error"),
                  OSError(28, "No space left on device")):
        with pytest.raises(type(error)) as got:
            CompiledBackward(Amp(error)).backward(None)
        assert got.value is error
    assert CompiledBackward(Amp(None)).loss_scaling is True  # the step reads the precision object through it


@pytest.fixture
def args(tmp_path, monkeypatch):
    """A one-step micro-llama run whose precision object's backward raises Paddle's words."""
    monkeypatch.setattr(runtime, "setup_env", lambda **k: None)  # (the suite's process keeps its threads)

    def raises(self, loss):
        raise RuntimeError(PADDLE_SAYS)

    monkeypatch.setattr(Fp32, "backward", raises)
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"model_name_or_path": "micro-llama", "input_dir": write_tokens(tmp_path / "data"),
                                "output_dir": str(tmp_path / "out"), "device": "cpu", "do_train": True, "max_steps": 1,
                                "max_seq_length": 16, "split": "1,0,0", "per_device_train_batch_size": 1,
                                "do_eval": False, "do_predict": False}))
    return path


def test_train_says_a_compiled_backward_failure_in_one_line(args, capsys):
    assert cli.main(["train", str(args), "--to_static", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: to_static: Paddle's compiled backward failed (RuntimeError: "
                                               + PADDLE_SAYS), err
    assert "set to_static false" in err[0]


def test_an_eager_runs_backward_failure_is_not_called_to_statics(args):
    with pytest.raises(RuntimeError, match="run_program_grad"):  # a bug's traceback, as before
        cli.main(["train", str(args), "--to_static", "false"])
