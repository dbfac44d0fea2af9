"""The model and data argument dataclasses of the flat, PaddleNLP-compatible argument file,
and `SECTIONS`, the three sections (with `training_arguments`) a file's keys fill.

Key names, types and defaults follow PaddleNLP's `llm/run_pretrain.py` so that its shipped
JSON files parse unchanged; `argument_field` says what each key's help and support tag mean.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pretrain_cli.config.argument_field import arg_field as _f
from pretrain_cli.config.training_arguments import TrainingArguments


@dataclass
class ModelArguments:
    model_name_or_path: str = _f(
        "tiny-qwen2",
        "Model source: a local directory with an HF config.json (and weights when continue_training), "
        "or a shipped preset (every published Qwen2, Qwen2.5, Qwen3, Llama 2, 3, 3.1 and 3.2 dense size, the "
        "Qwen3-MoE, Qwen2-MoE and Qwen1.5-MoE models, DeepSeek-V3 (and R1), DeepSeek-V2-Lite and Moonlight under "
        "their hub names, e.g. 'Qwen/Qwen2-7B', 'Qwen/Qwen3-30B-A3B', 'deepseek-ai/DeepSeek-V3' or "
        "'meta-llama/Llama-3.1-70B', and test sizes such as tiny-qwen2; `pretrain-cli check --list-models` lists "
        "them). Nothing is downloaded; a model of another family (Mixtral, Baichuan, ChatGLM, Yuan, GPT, ...) is "
        "refused by name.",
    )
    tokenizer_name_or_path: Optional[str] = _f(
        None, "Tokenizer directory (tokenizer.json, or vocab.json + merges.txt); None = model_name_or_path."
    )
    continue_training: bool = _f(
        False, "True: start from the weights in model_name_or_path. False: random init from its config.json."
    )
    num_hidden_layers: Optional[int] = _f(None, "Override config.num_hidden_layers (with continue_training it must "
                                                "equal the pretrained weights').")
    vocab_size: Optional[int] = _f(
        None, "Override config.vocab_size: a preset built to a tokenizer's size (random init only).", "extension"
    )
    fuse_attention_qkv: Optional[bool] = _f(
        None, "PaddleNLP fuses q/k/v into one Linear (renaming parameters); we keep HF names and layout.", "ignored"
    )
    fuse_attention_ffn: Optional[bool] = _f(
        None, "PaddleNLP fuses gate/up into one Linear; we keep HF names and layout.", "ignored"
    )
    use_fast_layer_norm: bool = _f(
        False, "selects PaddleNLP's custom `fast_ln` op; fused RMSNorm here uses Paddle's native op.", "ignored"
    )
    # --- Mixture-of-Experts routing and balance (qwen3_moe, qwen2_moe; no effect on a dense model)
    router_aux_loss_coef: Optional[float] = _f(
        None, "Weight of the load-balancing loss (transformers' formula, over all sparse layers) added to the "
        "training loss; None = config.json's router_aux_loss_coef (0.001 in the published Qwen MoE models); 0: off.",
    )
    moe_aux_loss_scope: str = _f(
        "micro_batch", "micro_batch: the balance loss over each micro-batch (transformers); global: the experts' "
        "token shares summed over the data-parallel ranks first (the global-batch balance Qwen3 was trained with).",
        "extension", choices=("micro_batch", "global"),
    )
    router_z_loss_coef: float = _f(
        0.0, "Weight of the router z-loss (mean logsumexp(router logits)^2, ST-MoE; 1e-3 is common); 0: off.",
        "extension",
    )
    moe_router_bias_update_rate: float = _f(
        0.0, "Auxiliary-loss-free balancing (DeepSeek-V3): each expert's routing bias moves by this much per step "
        "toward the less-loaded experts (1e-3 in DeepSeek-V3); 0: off (a checkpoint's bias is then kept, frozen). "
        "The bias is checkpointed, and exported where transformers' model has it (DeepSeek), not for Qwen MoE "
        "(whose exported model routes without it; eval and generate on a checkpoint route with it).",
        "extension",
    )
    capacity_factor: float = _f(
        0.0, "0: dropless (every routed token is computed; Qwen MoE's training). > 0: each expert computes at most "
        "capacity_factor x its balanced share of a micro-batch's assignments; the rest are dropped (weight 0).",
    )
    mtp_loss_weight: float = _f(
        0.3, "DeepSeek-V3's multi-token prediction (config.json num_nextn_predict_layers > 0): the weight λ of the "
        "mean MTP loss added to the training loss (0.3, later 0.1, in DeepSeek-V3); logged apart as mtp_loss. Unset, "
        "config.json's num_nextn_predict_lambda (PaddleNLP's name, whose default there is 1.0) when it has one.",
        "extension",
    )
    hidden_dropout_prob: float = _f(0.1, "only used by GPT configs in PaddleNLP; Llama/Qwen have no dropout.",
                                    "ignored")
    attention_probs_dropout_prob: float = _f(
        0.1, "only used by GPT configs in PaddleNLP; Llama/Qwen have no dropout.", "ignored"
    )


@dataclass
class DataArguments:
    input_dir: Optional[str] = _f(
        None,
        "Token data: a directory (every *.idx / *_idx.npz prefix, each weighted by its token count) or "
        "'w1 prefix1 w2 prefix2 ...' for a weighted blend.",
    )
    split: str = _f("949,50,1", "Train/valid/test document shares, separated by ',' or '/'.")
    max_seq_length: int = _f(1024, "Tokens per training sequence (each sample holds one more token for the labels).")
    data_impl: str = _f("mmap", "Token file format: mmap (MMIDIDX .bin/.idx).", choices=("mmap",))
    skip_warmup: bool = _f(True, "PaddleNLP pre-reads mmap files when False; pages load on demand here.", "ignored")
    share_folder: bool = _f(
        False, "PaddleNLP builds index caches on one rank; here every rank builds its cheap index itself.", "ignored"
    )
    data_cache: Optional[str] = _f(None, "Directory for on-disk sample-index caches (default: built in memory; it "
                                         "takes milliseconds).")
    sample_mode: str = _f(
        "packed",
        "packed: documents concatenated into max_seq_length+1 token samples (PaddleNLP/Megatron); "
        "padded: one document per sample, [BOT] doc [EOT] padded with [PAD], pads excluded from the loss.",
        "extension",
        choices=("packed", "padded"),
    )
    attention_mask_type: str = _f(
        "causal",
        "causal: a token attends to every earlier token of its packed sample, across document boundaries "
        "(PaddleNLP/Megatron pretraining). document: only to earlier tokens of its own document (boundaries from "
        "the token files' document index; as torchtitan, Megatron-LM, OLMo-core, MaxText offer): flashmask on GPU, "
        "a CPU kernel that skips the cross-document blocks (faster on short documents). No effect on padded samples.",
        "extension",
        choices=("causal", "document"),
    )
    reset_position_ids: Optional[bool] = _f(
        None, "With attention_mask_type document: RoPE positions restart at 0 at each document (None = true); "
        "false keeps them running across the packed sample.", "extension",
    )


SECTIONS = (("model", ModelArguments), ("data", DataArguments), ("training", TrainingArguments))
