"""What stays refused: one table (`REFUSED`), one line per product of parallel degrees an engine cannot run here
(for a Mixture-of-Experts model also the products with its expert-parallel degree).

Every other product of degrees runs (`distributed.steps.order`: the layout is a sequence of steps, so a product of axes
is the steps of each). A row names the key the user changes, the engine limit that stops it, and what to do;
`config.resolve` adds each matching row's line as a problem, `plan --fit` skips such candidates through the same
resolve, and docs/DISTRIBUTED.md ("What stays refused") lists the table. Degrees that do not divide (the world,
the heads, the sequence) are arithmetic, not engine limits: their rules stay with the keys (`config.context`,
`config.pipeline`, `config.resolve`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Degrees:
    """The degrees a refusal reads, as resolved so far (`sharding` the ranks ZeRO shards over, `data` the
    data-parallel ranks of one stage and one tp/cp group)."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    sep: int = 1
    stage: int = 0
    sharding: int = 1
    data: int = 1
    sp: bool = False
    ep: int = 1  # expert_parallel_degree as asked (its arithmetic is `config.expert`'s)
    moe: str = ""  # a Mixture-of-Experts model's model_type ("" for a dense model)
    mla: str = ""  # the model_type of a model with multi-head latent attention (`models.mla`; "" otherwise)
    device: str = "cpu"  # the run's: what stops a product may be the collective library's (gloo's, on CPU)


@dataclass(frozen=True)
class Refusal:
    """`when(degrees)`: the product it refuses; `line(degrees)`: "<key>: <what> is not supported (<engine limit>);
    <what to do>"."""

    name: str
    when: Callable[[Degrees], bool]
    line: Callable[[Degrees], str]


REFUSED = (
    Refusal("sep", lambda d: d.sep > 1,
            lambda d: f"sep_parallel_degree: {d.sep} is not supported: "
                      + "PaddleNLP's segment parallelism (all-to-all swaps of sequence and head shards around "
                        "attention) is not built here"
                      + (" on any device, and needs an all-to-all, which gloo lacks (CPU's collectives); "
                         if d.device == "cpu" else "; ")
                      + (f"use context_parallel_degree: {d.sep * d.cp} in place of both (sep {d.sep} x cp {d.cp}: "
                         f"attention across the ranks) to split each sequence as the file asks" if d.cp > 1 else
                         f"use context_parallel_degree: {d.sep} (attention across the ranks) to split each sequence")),
    Refusal("cp with ZeRO-3", lambda d: d.cp > 1 and d.stage == 3,
            lambda d: f"context_parallel_degree: {d.cp} with ZeRO-3 is not supported (ZeRO-3 runs on the semi-auto "
                      f"engine, whose distributed tensors the ring attention's autograd function cannot take: it "
                      f"sends dense blocks over the cp group; fleet's own stage 3 asserts CUDA); use sharding: "
                      f"stage1 or stage2 (the optimizer state split over cp x sharding ranks)"),
    Refusal("sp with ZeRO-3", lambda d: d.sp and d.stage == 3,
            lambda d: "sequence_parallel: not supported with sharding: stage3 (ZeRO-3 runs on the semi-auto engine, "
                      "whose sequence-parallel plans are not built here"
                      + (" on any device, and need reduce-scatter and all-to-all, which gloo lacks (CPU's "
                         "collectives)" if d.device == "cpu" else "")
                      + "; sequence parallelism here is the tp step's, on fleet's groups); use stage1 or stage2, or "
                        "set sequence_parallel: false"),
    Refusal("pp with ZeRO-3", lambda d: d.pp > 1 and d.stage == 3,
            lambda d: f"sharding: stage3 with pipeline_parallel_degree {d.pp} is not supported (fleet's pipeline "
                      f"has no parameter sharding; docs/DISTRIBUTED.md says why); use sharding: stage1 or stage2 "
                      f"with a pipeline, or stage3 without one"),
    Refusal("MoE with sequence parallelism or tp x cp", lambda d: bool(d.moe) and (d.sp or d.cp > 1 and d.tp > 1),
            lambda d: f"{'sequence_parallel: true' if d.sp else f'context_parallel_degree: {d.cp}'} with "
                      f"{'' if d.sp else f'tensor_parallel_degree: {d.tp} and '}a Mixture-of-Experts model ({d.moe}) "
                      f"is not supported ("
                      + ("sequence parallelism gives the tp ranks different tokens, and the experts' tensor-parallel "
                         "split needs every tp rank to route the same ones; not built here" if d.sp else
                         "the experts' tensor-parallel split under the ring attention is not built or tested here")
                      + ("); set sequence_parallel: false" if d.sp else
                         "); set tensor_parallel_degree: 1 (context parallelism runs with dp, ZeRO-1/2, pp and "
                         "expert parallelism)")),
    Refusal("ep with ZeRO-2/3",
            lambda d: bool(d.moe) and d.ep > 1 and (d.stage == 3 or d.stage == 2 and d.pp == d.tp == d.cp == 1),
            lambda d: f"expert_parallel_degree: {d.ep} with sharding: stage{d.stage} is not supported"
                      f"{'' if d.stage == 3 else ' without a pipeline, tensor or context parallelism'} ("
                      f"{'ZeRO-3' if d.stage == 3 else 'ZeRO-2 alone'} runs on the semi-auto engine, whose placements "
                      f"take every data rank to hold the same parameters, while each rank of an expert group holds "
                      f"other experts); use sharding: stage1 (ZeRO-1 over the rest of the model) or ''"
                      + ("" if d.stage == 3 else " (stage2 runs with pipeline_parallel_degree, "
                                                 "tensor_parallel_degree or context_parallel_degree > 1: fleet's "
                                                 "ZeRO-2 over the rest)")),
    Refusal("MLA with sequence parallelism or tp x cp",
            lambda d: bool(d.mla) and not d.moe and (d.sp or d.cp > 1 and d.tp > 1),
            lambda d: f"{'sequence_parallel: true' if d.sp else f'context_parallel_degree: {d.cp}'} with "
                      f"{'' if d.sp else f'tensor_parallel_degree: {d.tp} and '}multi-head latent attention "
                      f"({d.mla}) is not supported ("
                      + ("the tp step's split of MLA sums the latents' gradients over the tp group itself, which "
                         "sequence parallelism's reduce-scatter would sum again" if d.sp else
                         "MLA's tensor-parallel split under the ring attention is not built or tested")
                      + ("); set sequence_parallel: false" if d.sp else
                         "); set tensor_parallel_degree: 1 (context parallelism runs MLA without tp)")),
    Refusal("semi-auto sharding below the data ranks",
            lambda d: d.pp == 1 and d.cp == 1 and not d.sp and not fleet_tp(d)
            and (d.tp > 1 or d.stage in (2, 3)) and 1 < d.sharding < d.data,
            lambda d: f"sharding_parallel_degree: {d.sharding} of the {d.data} data-parallel ranks is not supported "
                      f"with {_semi_auto_keys(d)} (that layout runs on the semi-auto engine, whose sharding axis is "
                      f"every data rank; fewer run on fleet's groups: stage1 without tensor parallelism, and stage1/2 "
                      f"with a pipeline, sequence or context parallelism, or with multi-head latent attention's or "
                      f"expert parallelism's tensor parallelism); use -1 (shard over all {d.data})"),
)


def fleet_tp(d: Degrees) -> bool:
    """Whether the tensor parallelism of `d` on one stage without sequence or context parallelism is the `tp` layout
    step's on fleet's groups (its ZeRO-1/2 fleet's, over any sharding group), not the semi-auto engine's: multi-head
    latent attention except under ZeRO-3, and routed experts over expert groups. `config.parallel`'s `manual_tp`
    decides the engine, from the resolved expert degree (here the one asked: where they differ another line refuses);
    test_layout_steps checks this row against the engine it resolves."""
    return d.tp > 1 and (bool(d.mla) and d.stage != 3 or bool(d.moe) and d.ep > 1)


def _semi_auto_keys(d: Degrees) -> str:
    """The keys that put a layout of one stage on the semi-auto engine: ZeRO-2/3, or tensor parallelism alone."""
    stage = f"sharding: stage{d.stage}" if d.stage else ""
    tp = f"tensor_parallel_degree: {d.tp}" if d.tp > 1 else ""
    return " and ".join(k for k in (stage, tp) if k)


def refusals(degrees: Degrees) -> list[str]:
    """The line of every row of `REFUSED` that refuses `degrees`, in table order."""
    return [r.line(degrees) for r in REFUSED if r.when(degrees)]
