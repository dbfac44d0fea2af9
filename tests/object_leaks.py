"""What a call leaves alive: the gc-tracked objects after N calls, counted rather than timed, for the tests that a
workaround leaks nothing per call (tests/unit/test_host_tensors.py on CPU, tests/parity/test_gpu_host_tensors.py on
the emulated GPU)."""
import gc

N = 300  # calls counted


def alive_after(fn, n: int = N) -> int:
    """How many more gc-tracked objects are alive after `n` calls of `fn` than before them (a first call not
    counted: anything made once, caches and imports, is not a leak)."""
    fn()
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(n):
        fn()
    gc.collect()
    return len(gc.get_objects()) - before
