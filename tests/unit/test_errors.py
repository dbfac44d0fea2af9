"""What counts as a device out-of-memory error, and the exit code it carries."""
from pretrain_cli.errors import DeviceOutOfMemory, UserError, is_out_of_memory


def test_out_of_memory_is_recognised_and_exits_1():
    assert is_out_of_memory(MemoryError("(ResourceExhausted) Fail to alloc memory of 8589934592 size"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert is_out_of_memory(RuntimeError("(ResourceExhausted) Out of memory error on GPU 0."))
    assert not is_out_of_memory(RuntimeError("Connection reset by peer"))
    assert not is_out_of_memory(ValueError("out of memory"))
    # a failed allocation in a PyLayer's backward comes back as Paddle's (External) error, an OSError
    assert is_out_of_memory(OSError("(External) { MemoryError: (ResourceExhausted) Fail to alloc memory of 8 size"))
    assert is_out_of_memory(OSError(12, "Cannot allocate memory"))  # ENOMEM
    assert not is_out_of_memory(OSError(28, "No space left on device"))
    e = DeviceOutOfMemory(7)
    assert isinstance(e, UserError) and e.exit_code == 1 and e.step == 7 and e.lines == ["out of memory at step 7"]
