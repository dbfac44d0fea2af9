"""PaddleNLP's segment parallelism (`sep_parallel_degree`) is refused with context parallelism as what to use instead;
a file that sets both (PaddleNLP splits each sequence sep x cp ways) was told to use `context_parallel_degree: 2`,
the value it already had: the line names the product, the split the file asked for."""
import pytest
from run_helpers import resolve_run

from pretrain_cli.errors import UserError


def _line(*argv, world=4, device="cpu"):
    with pytest.raises(UserError) as e:
        resolve_run("--max_seq_length", "128", *argv, world=world, device=device)
    return next(x for x in str(e.value).splitlines() if x.startswith("sep_parallel_degree:"))


def test_sep_alone_is_told_the_same_degree_of_context_parallelism():
    assert _line("--sep_parallel_degree", "2").endswith("use context_parallel_degree: 2 (attention across the ranks) "
                                                        "to split each sequence")


def test_sep_with_context_parallelism_is_told_their_product():
    assert _line("--sep_parallel_degree", "2", "--context_parallel_degree", "2").endswith(
        "use context_parallel_degree: 4 in place of both (sep 2 x cp 2: attention across the ranks) to split each "
        "sequence as the file asks")


def test_the_engine_limit_named_is_the_devices():
    """gloo (CPU) has no all-to-all; NCCL has one, and on GPUs the segment-parallel attention itself is what is not
    built here: the GPU line said 'which gloo lacks' too."""
    assert "all-to-all, which gloo lacks (CPU's collectives)" in _line("--sep_parallel_degree", "2")
    gpu = _line("--sep_parallel_degree", "2", "--device", "gpu", device="gpu")
    assert "gloo" not in gpu
    assert ("PaddleNLP's segment parallelism (all-to-all swaps of sequence and head shards around attention) is not "
            "built here; use context_parallel_degree: 2") in gpu


def test_the_cpu_line_says_segment_parallelism_is_not_built_on_any_device():
    """On CPU the line named gloo's missing all-to-all only, as if a GPU run would take it."""
    assert "is not built here on any device" in _line("--sep_parallel_degree", "2")


def test_sequence_parallelism_under_zero3_names_the_devices_limit():
    """The sp with ZeRO-3 line said 'which gloo lacks' on GPUs too (NCCL has reduce-scatter and all-to-all)."""
    def sp_line(device):
        with pytest.raises(UserError) as e:
            resolve_run("--max_seq_length", "128", "--device", device, "--tensor_parallel_degree", "2",
                        "--sequence_parallel", "true", "--sharding", "stage3", world=4, device=device)
        return next(x for x in str(e.value).splitlines() if x.startswith("sequence_parallel:"))

    assert "which gloo lacks (CPU's collectives)" in sp_line("cpu")
    gpu = sp_line("gpu")
    assert "gloo" not in gpu and "not built here" in gpu, gpu
    assert gpu.endswith("use stage1 or stage2, or set sequence_parallel: false"), gpu
