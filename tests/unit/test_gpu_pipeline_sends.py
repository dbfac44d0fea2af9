"""fleet's stage-to-stage sends on NCCL, decided by fleet's own code (pp_utils/p2p_communication.py, Paddle 3.3.1):
with partial sends on (fleet's default), each tp rank sends 1/tp of its activation and the receiving stage all-gathers
the pieces over the tp group, which is right only when every tp rank holds the same tensor. Under sequence
parallelism each tp rank holds its own part of the sequence, so before the fix (NCCL kept fleet's default) a tp x pp
x sp run on GPUs fed every later stage pieces of different tensors."""
import numpy as np

from pretrain_cli import runtime

paddle = runtime.import_paddle()


def _fleet_partial_send(pieces: list, enabled: bool) -> list:
    """What each receiving tp rank holds after fleet's send/recv of the tp ranks' `pieces` (one tensor each):
    `send_partial` of rank t's t-th flat slice, then `all_gather_partial` over the tp group, when
    `_is_valid_send_recv_partial` says so; else each receives its own sender's whole tensor."""
    from paddle.distributed.fleet.meta_parallel.pp_utils import p2p_communication as p2p

    tp = len(pieces)
    saved = p2p._enable_partial_send_recv
    p2p._enable_partial_send_recv = enabled  # what PipelineParallel hands initialize_p2p_groups
    try:
        partial = p2p._is_valid_send_recv_partial(pieces[0], tp)
    finally:
        p2p._enable_partial_send_recv = saved
    if not partial:
        return [p.numpy() for p in pieces]
    flat = [p.numpy().reshape(-1) for p in pieces]
    size = flat[0].size // tp
    whole = np.concatenate([flat[t][t * size:(t + 1) * size] for t in range(tp)])  # slice t from tp rank t
    return [whole.reshape(pieces[0].shape) for _ in range(tp)]


def _flags(gloo: bool, sequence_parallel: bool):
    from paddle.distributed.fleet import DistributedStrategy

    from pretrain_cli.distributed.comms.collectives import Collectives
    from pretrain_cli.distributed.strategies.pipeline import pipeline_configs
    from pretrain_cli.run_config import Loop
    from pretrain_cli.run_layout import ParallelConfig

    strategy = DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 1, "mp_degree": 2, "pp_degree": 2}
    parallel = ParallelConfig(world_size=4, tp_degree=2, pp_degree=2, sequence_parallel=sequence_parallel)
    configs = pipeline_configs(Loop(micro_batch=1, grad_accum=2), parallel)
    strategy.pipeline_configs = Collectives(gloo=gloo).pipeline_flags(configs, strategy.hybrid_configs)
    return strategy  # as `Topology.init_fleet` sets it


def test_nccl_pipelines_send_each_tp_ranks_whole_sequence_parallel_piece():
    strategy = _flags(gloo=False, sequence_parallel=True)
    assert strategy.hybrid_configs["pp_configs"].use_batch_p2p_comm  # NCCL: batched sends
    enabled = strategy.pipeline_configs["enable_partial_send_recv"]
    rng = np.random.default_rng(0)
    pieces = [paddle.to_tensor(rng.standard_normal((1, 4, 8)).astype("float32")) for _ in range(2)]  # [b, s/tp, h]
    got = _fleet_partial_send(pieces, enabled)
    for t in range(2):
        np.testing.assert_array_equal(got[t], pieces[t].numpy())


def test_nccl_pipelines_keep_fleets_partial_send_where_the_tp_ranks_hold_one_tensor():
    """Without sequence parallelism every tp rank holds the same activation: fleet's partial send (1/tp of the
    bytes each) delivers it whole, and stays on (PaddleNLP's choice); gloo has no partial send kernel."""
    strategy = _flags(gloo=False, sequence_parallel=False)
    assert strategy.pipeline_configs["enable_partial_send_recv"]
    same = paddle.to_tensor(np.random.default_rng(1).standard_normal((1, 8, 8)).astype("float32"))
    for got in _fleet_partial_send([same, same.clone()], True):
        np.testing.assert_array_equal(got, same.numpy())
    for sp in (False, True):
        assert not _flags(gloo=True, sequence_parallel=sp).pipeline_configs["enable_partial_send_recv"]
