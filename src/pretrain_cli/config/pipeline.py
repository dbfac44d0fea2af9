"""PaddleNLP's pipeline keys (`pipeline_parallel_degree`, `virtual_pp_degree`, `pipeline_parallel_config`) ->
the pipeline degree the run uses, with the rules that refuse what fleet's engine cannot run here.

Each `pipeline_parallel_config` flag means what it means in PaddleNLP: it is applied, or a note says why it
has no effect here; an unknown flag is refused. `distributed/strategies/pipeline.py` runs the result.
"""
from __future__ import annotations

# PaddleNLP flag -> why it changes nothing here (None: it is how the engine runs already)
PP_FLAGS = {
    "disable_p2p_cache_shape": None,  # shapes are sent with every message (evaluation uses another batch size)
    "enable_clear_every_step_cache": None,  # nothing is cached between steps (see above)
    "disable_partial_send_recv": "activations go whole to the next stage under sequence parallelism and on CPU; "
                                 "elsewhere (GPU, every tp rank holding the same activation) fleet's partial send "
                                 "delivers the same tensor with 1/tp of the bytes (`Collectives.pipeline_flags`)",
    "enable_delay_scale_loss": "each micro-batch's loss is divided by gradient_accumulation_steps as it is "
                               "computed (the same gradients up to rounding); the trainer owns the update",
    "enable_dp_comm_overlap": "a GPU overlap of the data-parallel all-reduce with backward; the all-reduce runs "
                              "once after the schedule",
    "enable_sharding_comm_overlap": "a GPU overlap of the sharding reduce with backward; it runs after the schedule",
    "enable_overlap_p2p_comm": "a GPU overlap of stage-to-stage sends with compute; sends run in order here",
    "enable_release_grads": "releases gradient buffers after each step on GPU; the trainer clears them",
    "enable_timer": "fleet's per-phase pipeline timers; the trainer's step timing is logged instead",
    "enable_offload_queue": "a GPU memory offload of queued activations",
    "enable_dynamic_shape": None,  # every message carries its shape already
    "disable_non_batch_p2p_comm": "batched stage-to-stage sends; they run one by one here (fleet's "
                                  "use_batch_p2p_comm is off, as its CPU build requires)",
    "use_dualpipev": "DeepSeek-V3's DualPipeV schedule (PaddleNLP's DeepSeek pipeline model reads it); fleet's "
                     "1F1B (or interleaved) schedule runs here",
    "best_unbalanced_scheduler": "a memory-balanced variant of the interleaved schedule for fewer micro-batches than "
                                 "2 x stages, which is refused here; the interleaved schedule runs as fleet's default",
}


def parse_pp_config(text: str) -> list[str]:
    """The notes for PaddleNLP's `pipeline_parallel_config` flags; raises for an unknown flag."""
    from pretrain_cli.errors import UserError

    notes = []
    for flag in text.replace(",", " ").split():
        if flag not in PP_FLAGS:
            raise UserError(f"pipeline_parallel_config: unknown flag {flag!r}; known: {', '.join(sorted(PP_FLAGS))}")
        if PP_FLAGS[flag] is not None:
            notes.append(f"pipeline_parallel_config: {flag} has no effect here: {PP_FLAGS[flag]}")
    return notes


def layout_refusals(world: int, pp: int, vpp: int = 1, layers: int | None = None, acc: int | None = None) -> list[str]:
    """The pipeline's own arithmetic: one line per refusal, naming the key and what to do (`resolve_pipeline` adds
    them as problems): stages dividing the world and the layers, and fleet's interleaved schedule
    (`virtual_pp_degree`) within its limits, `acc` being the micro-batches a step. Products with other axes that
    no engine runs (ZeRO-3 with a pipeline) are `config.refusals`' table."""
    out = []
    if pp <= 1:
        return out
    if world % pp:
        return [f"pipeline_parallel_degree: {pp} does not divide the world size {world}; use a divisor of it"]
    if layers is not None and layers < pp:
        return [f"pipeline_parallel_degree: {pp} stages for {layers} decoder layers; use at most {layers}"]
    if vpp > 1:  # fleet's interleaved 1F1B (PipelineParallelWithInterleave): its own limits, and equal chunks
        if pp <= 2:
            out.append(f"virtual_pp_degree: {vpp} needs more than 2 pipeline stages (fleet's interleaved schedule), "
                       f"pipeline_parallel_degree is {pp}; set virtual_pp_degree to 1 or use 3+ stages")
        elif layers is not None and layers % (pp * vpp):
            out.append(f"virtual_pp_degree: {layers} decoder layers do not split into {pp} stages x {vpp} equal "
                       f"chunks; use a virtual_pp_degree with pipeline_parallel_degree x it dividing {layers}")
        elif acc is not None and acc < 2 * pp:
            out.append(f"virtual_pp_degree: fleet's interleaved schedule needs gradient_accumulation_steps >= 2 x "
                       f"stages ({2 * pp}), got {acc}; raise it or set virtual_pp_degree to 1")
    return out


def resolve_pipeline(args, model_cfg, world: int, notes: list, problems) -> tuple[int, int]:
    """(pipeline_parallel_degree, virtual_pp_degree) for `world` processes; problems for what cannot run."""
    t = args.training
    pp, vpp = max(t.pipeline_parallel_degree, 1), max(t.virtual_pp_degree, 1)
    if pp == 1:
        if vpp > 1:
            notes.append("virtual_pp_degree: only meaningful with pipeline_parallel_degree > 1; ignored")
        if t.pipeline_parallel_config:
            notes.append("pipeline_parallel_config: no pipeline (pipeline_parallel_degree 1); ignored")
        return 1, 1
    acc = t.gradient_accumulation_steps
    refused = layout_refusals(world, pp, vpp, model_cfg.num_hidden_layers, acc)
    for line in refused:
        problems.add(line)
    if refused and (world % pp or model_cfg.num_hidden_layers < pp):
        return 1, 1
    problems.run(lambda: notes.extend(parse_pp_config(t.pipeline_parallel_config or "")))
    if 1 <= acc < pp:
        notes.append(f"pipeline_parallel_degree: {acc} micro-batch(es) per step for {pp} stages: each stage idles "
                     f"for {(pp - 1) / (acc + pp - 1):.0%} of the step (the bubble, (P-1)/(m+P-1)); raise "
                     f"gradient_accumulation_steps to at least {4 * pp} to keep it small")
    return pp, vpp
