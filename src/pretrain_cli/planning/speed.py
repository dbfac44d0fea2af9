"""The speed model `plan` and `plan --fit` rank layouts by (docs/PLAN.md): per optimizer step on one device,
compute over the pipeline's stages and its bubble (1F1B or interleaved), plus the bytes it sends on its
tensor-parallel, pipeline, ZeRO-3, context-parallel and expert-parallel groups, each over the link its group uses:
in-node or cross-node (`planning.hardware.links`). Each formula is written once here. No Paddle.
"""
from __future__ import annotations

from pretrain_cli.planning.experts import dispatch_bytes, mlp_reduce_rows
from pretrain_cli.planning.context import context_traffic_bytes
from pretrain_cli.planning.memory import Setup, mtp_params, stage_experts
from pretrain_cli.planning.report import Plan, link_gbps
from pretrain_cli.run_layout import ParallelConfig

NOMINAL_TFLOPS = 1.0  # ranks candidates when the device has no known peak (tokens/s is then not shown)


def pipeline_bubble(stages: int, micro_batches: int, virtual: int = 1) -> float:
    """The share of a step each stage idles: (P − 1)/(V·m + P − 1) with V model chunks per stage (1F1B: V = 1;
    interleaved 1F1B: each of the P − 1 idle slots at either end is one chunk's, 1/V of a stage's, Megatron's
    (P − 1)/(V·m) of the busy time). fleet's interleaved schedule (3.3.1) has exactly this bubble also when m is
    not a multiple of P (its order simulated with unit chunk times: docs/PLAN.md, Speed model)."""
    return (stages - 1) / (virtual * micro_batches + stages - 1)


def partial_sends(setup: Setup, par: ParallelConfig) -> bool:
    """Whether a pipeline stage sends each tensor-parallel rank's 1/tp of its activation (fleet's partial send:
    `enable_partial_send_recv`, which `strategies.pipeline.pipeline_configs` turns off under sequence parallelism and
    `comms.collectives.Collectives.pipeline_flags` on gloo, and which fleet applies when the tensor's element count
    divides by tp: pp_utils/p2p_communication.py 3.3.1)."""
    elements = setup.micro_batch * setup.seq_len * setup.model.hidden_size  # one [b, s, hidden]
    return (par.pp_degree > 1 and par.tp_degree > 1 and not par.sequence_parallel and setup.device != "cpu"
            and elements % par.tp_degree == 0)


def traffic(setup: Setup, par: ParallelConfig, params: dict) -> dict[str, float]:
    """Bytes one device sends per optimizer step on each group (the speed model's terms, docs/PLAN.md):

    tp    = acc × its stage's layers × (n_attn + n_mlp × r) × 2(t−1)/t × b·s·hidden·c  (all-reduces per layer of the
            attention and MLP outputs: n_attn = n_mlp = 2, forward and backward; + 1 each under `full`, + 1 attention
            under `full_attn` recompute; r = `experts.mlp_reduce_rows`, 1 for a dense model, top_k (+1 shared)
            on a MoE model's sparse layers), + acc × 2V × (t−1)/t × b·s·hidden·c under a pipeline's partial sends
            (the receiver all-gathers the pieces of each activation and gradient over the tp group)
    pp    = acc × 2V × b·s·hidden·c / t  (one activation forward, its gradient back, per micro-batch and model chunk,
            V = virtual_pp_degree: what a middle stage sends, the end stages 2V − 1; the interleaved schedule's last
            stage sends its chunks' outputs back to the first stage's next chunk; on NCCL without sequence parallelism
            fleet's partial send, each tp rank 1/t of the activation they all hold (`partial_sends`); under
            sequence parallelism each rank's own 1/t of the sequence, whole; on gloo (CPU) the whole activation
            from every tp rank, without the /t)
    zero3 = acc × 3 × weight bytes of its stage and TP slice × (S−1)/S  (gathered for forward and backward, gradients
            reduce-scattered, per micro-batch)
    cp    = acc × `context.context_traffic_bytes` (per layer ring attention's K/V blocks, again under full/full_attn
            recompute, and its dK/dV blocks)
    ep    = acc × `experts.dispatch_bytes` (the expert group's tokens gathered, the experts' outputs reduce-scattered)
    dp    = 2(D−1)/D × gradient bytes of its stage and TP slice, once per step, D = data ranks × cp (the ranks
            holding the same slice): DP's all-reduce, ZeRO-1's reduce and broadcast, ZeRO-2's reduce-scatter and
            all-gather move the same bytes; under ZeRO-3 the gradients are in `zero3`; under expert parallelism
            a rank's routed experts are reduced over their D/ep holders instead; under a pipeline each stage's own
            experts (`memory.stage_experts`) and the multi-token prediction modules' gradients on the last stage
            (`memory.mtp_params`), the most of any stage (`_stage_gradient_bytes`)
    `params` is `models.flops.param_counts` of the model."""
    params_total = params["total"]
    acc, tp, pp, deg = setup.micro_batches, par.tp_degree, par.pp_degree, par.sharding_degree
    vpp = par.virtual_pp_degree  # each micro-batch crosses every stage boundary once per model chunk
    act = setup.micro_batch * setup.seq_len * setup.model.hidden_size * setup.compute_bytes  # one [b, s, hidden]
    out = {"tp": 0.0, "pp": 0.0, "zero3": 0.0, "cp": 0.0, "ep": 0.0, "dp": 0.0}
    partial = partial_sends(setup, par)
    if tp > 1:
        n_attn, n_mlp = 2 + (setup.recompute in ("full", "full_attn")), 2 + (setup.recompute == "full")
        n = n_attn + n_mlp * mlp_reduce_rows(setup)
        out["tp"] = acc * setup.model.num_hidden_layers / pp * n * 2 * (tp - 1) / tp * act
        out["tp"] += acc * 2 * vpp * (tp - 1) / tp * act if partial else 0.0  # the received pieces all-gathered
    if pp > 1:
        out["pp"] = acc * 2 * vpp * act / (tp if par.sequence_parallel or partial else 1)
    if par.sharding_stage == 3 and deg > 1:
        weight_bytes = params_total / tp / pp * (2 if setup.amp_level == "O2" else 4)
        out["zero3"] = acc * 3 * weight_bytes * (deg - 1) / deg
    if par.cp_degree > 1:  # `setup.seq_len` is one rank's share of the sequence
        out["cp"] = acc * context_traffic_bytes(setup.model, setup.micro_batch, setup.seq_len * par.cp_degree,
                                                par.cp_degree, setup.compute_bytes, setup.recompute)
    if setup.ep > 1:
        out["ep"] = acc * dispatch_bytes(setup, setup.model.num_hidden_layers / pp)
    replicas = par.data_world_size * par.cp_degree
    if replicas > 1 and par.sharding_stage < 3:
        out["dp"] = max(_stage_gradient_bytes(setup, params, replicas, stage) for stage in range(pp))
    return out


def _stage_gradient_bytes(setup: Setup, params: dict, replicas: int, stage: int) -> float:
    """`traffic`'s dp term for pipeline stage `stage`: a 1/pp share of all but the routed experts (and on the last
    stage the multi-token prediction modules' other parameters) over the `replicas`, and the stage's own routed
    experts (`memory.stage_experts`: its sparse layers', the modules' on the last stage) over their replicas / ep
    holders, or with the rest without expert parallelism. Every stage reduces at the step's end; `traffic` takes
    the most. Counting every stage's experts (and the modules') on each planned DeepSeek-V3 at pp 16 x ep 8 on 256
    ranks at 171.57 GB a step; its fullest stage sends 16.55."""
    grad_bytes = 2 if setup.amp_level == "O2" and not setup.master_grad else 4
    tp, pp = setup.tp, setup.pp
    own = stage_experts(setup, stage)  # ÷ ep · tp
    rest = (params["total"] - params["experts"]) / tp / pp + (mtp_params(setup)[0] if stage == pp - 1 else 0.0)
    if setup.ep > 1:
        routed, holders = own, replicas // setup.ep
    else:
        routed, holders, rest = 0.0, replicas, rest + own
    return (2 * (replicas - 1) / replicas * rest + 2 * (holders - 1) / holders * routed) * grad_bytes


def speed(r: Plan) -> dict:
    """Predicted seconds per optimizer step and tokens/s (whole run) for one planned layout: compute over the
    pipeline's stages and bubble, plus the plan's TP, PP, ZeRO-3 and CP traffic (`traffic`), each term over the link
    its group uses (`report.link_gbps`: in-node when the group stays inside a node, else cross-node)."""
    par, peak = r.parallel, r.device.peak_tflops
    flops = r.micro_batch * r.gradient_accumulation_steps * r.max_seq_length * r.flops_per_token.hardware
    compute = flops / par.tp / par.pp / par.cp / ((peak or NOMINAL_TFLOPS) * 1e12 * r.mfu) / (1 - par.pipeline_bubble)
    comm = sum(gb / link_gbps(r, term) for term, gb in r.traffic_gb_per_step.items())
    step = compute + comm
    known = peak is not None
    return {"step_seconds": step if known else None, "compute_seconds": compute if known else None,
            "comm_seconds": comm if known else None, "tokens_per_sec": r.tokens_per_step / step if known else None,
            "rank_seconds": step}
