"""The tiny model the fp16 loss-scaling tests step through the project's `Step` and `Amp` and compare with Paddle's
AdamW stepping a copy of it: on fleet's layouts (test_gpu_loss_scaling.py) and on the semi-auto engine
(test_semi_auto_amp.py). One definition, so both compare against the same model."""
from gpu_emulation import paddle


class Tiny(paddle.nn.Layer):
    """Two parameters and a loss of (sum of squares, token count); `gain` scales the output, so a test can push the
    scaled fp16 loss past its range (an overflow)."""

    def __init__(self):
        super().__init__()
        self.w = self.create_parameter([4, 3])
        self.u = self.create_parameter([3])
        self.gain = 1.0

    def forward(self, ids, labels=None):
        x = paddle.nn.functional.one_hot(ids % 4, 4).astype("float32")  # [b, s, 4]
        y = (paddle.matmul(x, self.w) + self.u) * self.gain  # [b, s, 3]
        # the count computed from ids (not paddle.to_tensor): on the semi-auto engine it is then a DistTensor on
        # the ids' mesh, as the loss is
        return (y * y).sum(), (ids * 0 + 1).astype("float32").sum()
