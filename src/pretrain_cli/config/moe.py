"""The Mixture-of-Experts keys of an argument file resolved into `run_config.MoeConfig`.

The architecture (experts, top-k, `norm_topk_prob`, sparse layers) is the model's config.json; what is decided
here is how training routes and balances: the load-balancing weight (None keeps config.json's
`router_aux_loss_coef`), its scope, the router z-loss, the auxiliary-loss-free bias and the capacity. On a dense
model the keys have no effect, and a file that sets one gets a note saying so.
"""
from __future__ import annotations

import math

from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.errors import Problems, UserError
from pretrain_cli.run_config import MoeConfig

DEEPSEEK_BIAS_RATE = 0.001  # DeepSeek-V3 paper: γ = 0.001 (then 0 for the last 500B tokens)
DEEPSEEK_ALPHA = {"deepseek_v3": 1e-4, "deepseek_v2": 1e-3}  # the papers' sequence-wise / expert-level α
KEYS = ("router_aux_loss_coef", "moe_aux_loss_scope", "router_z_loss_coef", "moe_router_bias_update_rate",
        "capacity_factor")


def aux_coefficient(args, model_cfg) -> float:
    """The balance loss's weight: `router_aux_loss_coef` when the file sets it, else the model's own: config.json's
    `router_aux_loss_coef` (transformers' load-balancing loss) or, for DeepSeek's sequence-wise loss
    (`models.deepseek_moe`), its `aux_loss_alpha` (the hub's key) or `router_aux_loss_coef` (PaddleFormers' name of
    it, kept in `extra`: `config_checks.OTHER_FAMILIES_KEYS`), else the paper's α."""
    if args.model.router_aux_loss_coef is not None:
        return float(args.model.router_aux_loss_coef)
    if model_cfg.model_type in DEEPSEEK_ALPHA:
        said = [model_cfg.extra.get(k) for k in ("aux_loss_alpha", "router_aux_loss_coef")]
        return float(next((v for v in said if v is not None), DEEPSEEK_ALPHA[model_cfg.model_type]))
    return float(model_cfg.router_aux_loss_coef or 0.0)


def both_weights_note(args, model_cfg) -> str | None:
    """The note for a DeepSeek config.json that gives its balance weight under both names at two values
    (`aux_coefficient` takes aux_loss_alpha's): a new model's file is refused so (`models.config_checks`), but
    pretrained weights' is read as it is, and the run must say which of the two it trains with."""
    if args.model.router_aux_loss_coef is not None or model_cfg.model_type not in DEEPSEEK_ALPHA:
        return None
    alpha, coef = (model_cfg.extra.get(k) for k in ("aux_loss_alpha", "router_aux_loss_coef"))
    if alpha is None or coef is None or alpha == coef:
        return None
    return (f"config.json: aux_loss_alpha ({alpha}) and router_aux_loss_coef ({coef}) both set DeepSeek's balance "
            f"loss weight (the hub's and PaddleFormers' name of it); the run takes {float(alpha):g}, "
            f"aux_loss_alpha's (the hub's name); set router_aux_loss_coef in the argument file for another")


def resolve_moe(args, model_cfg, parallel, notes: list, problems: Problems) -> MoeConfig:
    m = args.model
    moe_model = model_cfg is not None and bool(model_cfg.expert_layers)  # an MTP module's experts count
    if moe_model and args.training.recompute and args.training.recompute_use_reentrant:
        problems.add("recompute_use_reentrant: true loses the router losses' gradients of a Mixture-of-Experts model "
                     "(the reentrant recompute runs the first forward without autograd); set it to false")
    # the counts are summed over every rank (`comm.sum_over_ranks`); the shares are ratios, so the tp ranks of expert
    # parallelism (the tp step's ranks route the same tokens) count each token tp times and change none of them
    if moe_model and model_cfg.model_type == "deepseek_v2" and model_cfg.norm_topk_prob:
        notes.append("norm_topk_prob: true has no effect on DeepSeek-V2's routing, as in transformers (its weights are "
                     "the scores x routed_scaling_factor; DeepSeek's own V2 code normalises instead of scaling)")
    # the scope decides something for transformers' balance loss only (DeepSeek's is per sequence: a note below),
    # and not on the semi-auto engine (tp alone or with ZeRO-2/3: over the global batch whatever the file says)
    # (context parallelism's ranks count other tokens of the same sequences: summed over every rank, once each)
    tp_copies = parallel.tp_degree if parallel is not None and parallel.ep_degree > 1 else 1
    if (m.moe_aux_loss_scope == "global" and moe_model and model_cfg.model_type not in DEEPSEEK_ALPHA
            and parallel is not None and not parallel.traits.global_batch
            and parallel.data_world_size * tp_copies * parallel.cp_degree != parallel.world_size):
        problems.add("moe_aux_loss_scope: global sums the experts' token counts over the data-parallel ranks, "
                     "which is wired when every rank is a data rank (dp/sharding, cp, tp with "
                     "expert_parallel_degree, or tp and ZeRO-2/3 on the semi-auto engine, which count over the "
                     "global batch), not across pipeline stages; use micro_batch with pipeline_parallel_degree")
    if moe_model and parallel is not None and parallel.cp_degree > 1 and m.capacity_factor > 0:
        problems.add(f"capacity_factor: {m.capacity_factor} with context_parallel_degree {parallel.cp_degree} is not "
                     f"supported (each cp rank routes its chunks of the sequences, not the micro-batch a capacity is "
                     f"counted over, so other assignments would be dropped than on one process); set capacity_factor "
                     f"to 0 (dropless)")
    scope = m.moe_aux_loss_scope
    if moe_model and parallel is not None and parallel.world_size > 1 and parallel.traits.global_batch:
        if scope != "global" and model_cfg.model_type not in DEEPSEEK_ALPHA:
            notes.append("moe_aux_loss_scope: global: with sharding stage2/3 or tensor parallelism alone the balance "
                         "loss is computed over the global batch (Paddle's semi-auto engine sees each rank's batch as "
                         "a piece of it), so micro_batch is not available; global is the same objective on every "
                         "layout")
        scope = "global"
    if moe_model and model_cfg.model_type in DEEPSEEK_ALPHA and "moe_aux_loss_scope" in args.explicit:
        notes.append(f"moe_aux_loss_scope: no effect on {model_cfg.model_type}: its balance loss is DeepSeek's "
                     f"sequence-wise one, per sequence whatever the layout")
    if (model_cfg is not None and "mtp_loss_weight" in args.explicit
            and not model_cfg.num_nextn_predict_layers):
        notes.append("mtp_loss_weight: the model has no multi-token prediction module (config.json "
                     "num_nextn_predict_layers); no effect")
    for key in ("router_aux_loss_coef", "router_z_loss_coef", "moe_router_bias_update_rate", "capacity_factor",
                "mtp_loss_weight"):
        val = getattr(m, key)
        if val is not None and (not math.isfinite(val) or val < 0):
            problems.add(f"{key}: must be a finite number >= 0, got {val}")
    if 0 < m.capacity_factor < 1:
        notes.append(f"capacity_factor: {m.capacity_factor} < 1 drops tokens even under perfect balance")
    set_here = [k for k in KEYS if k in args.explicit]
    if set_here and model_cfg is not None and not moe_model:
        notes.append(f"{', '.join(set_here)}: the model ({model_cfg.model_type}) has no experts; no effect")
    rate = m.moe_router_bias_update_rate
    if moe_model and model_cfg.topk_method == "noaux_tc" and "moe_router_bias_update_rate" not in args.explicit:
        rate = DEEPSEEK_BIAS_RATE  # DeepSeek-V3's recipe: its routing is balanced by the bias
        notes.append(f"moe_router_bias_update_rate: {rate} (DeepSeek-V3's γ, the default for its noaux_tc routing; "
                     f"set 0 to freeze the checkpoint's e_score_correction_bias)")
    aux = aux_coefficient(args, model_cfg) if moe_model else m.router_aux_loss_coef
    if moe_model and (both := both_weights_note(args, model_cfg)):
        notes.append(both)
    return MoeConfig(aux_loss_coef=aux, aux_loss_scope=scope,
                     z_loss_coef=m.router_z_loss_coef, bias_update_rate=rate,
                     capacity_factor=m.capacity_factor, mtp_loss_weight=mtp_weight(args, model_cfg, problems))


def mtp_weight(args, model_cfg, problems: Problems) -> float:
    """The multi-token prediction loss's weight λ: `mtp_loss_weight` (or PaddleNLP's name for it,
    `num_nextn_predict_lambda`) when the file sets it, else config.json's `num_nextn_predict_lambda` (PaddleNLP's
    DeepSeek-V3 config reads it there: a PaddleNLP model directory's weight is the one it trained with), else ours."""
    lam = model_cfg.extra.get("num_nextn_predict_lambda") if model_cfg is not None else None
    if "mtp_loss_weight" in args.explicit or lam is None or not model_cfg.num_nextn_predict_layers:
        return args.model.mtp_loss_weight
    if isinstance(lam, bool) or not isinstance(lam, (int, float)) or not math.isfinite(lam) or lam < 0:
        problems.add(f"{_config_json(args)}: num_nextn_predict_lambda (the multi-token prediction loss's weight) must "
                     f"be a finite number >= 0, got {lam!r}; set it so, or set mtp_loss_weight in the arguments")
        return args.model.mtp_loss_weight
    return float(lam)


def _config_json(args) -> str:
    """The model's config.json as `ModelConfig.from_dict` names it (`<model_dir>/config.json`: a preset's too)."""
    try:
        return str(resolve_model_dir(args.model.model_name_or_path) / "config.json")
    except (UserError, TypeError):  # (not reached in a run: its model directory was read before)
        return "config.json"
