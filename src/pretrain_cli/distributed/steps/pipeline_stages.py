"""The pipeline cut (the `pp` step of `distributed.steps.order`): the finished model's own sublayers as fleet
`PipelineLayer` items, and the last stage's loss.

The items: the embedding (or, tied, fleet's `SharedLayerDesc` of its weight on the first and last stage), one
item per decoder layer, the final norm, the LM head's weight. `models.stages.stage_bounds` splits the decoder layers
over the stages as evenly as they go (the embedding rides with the first, the norm and head with the last).
Packed-document fields (`position_ids`, `doc_start`) travel between stages with the hidden states. Imported by the
layout steps only, after the environment is set (paddle is imported at the top).
"""
from __future__ import annotations

import paddle.nn as nn

from pretrain_cli.models.stages import stage_bounds
from pretrain_cli.run_layout import ParallelConfig


class Embed(nn.Layer):
    """First stage: token ids (+ document fields) -> (hidden, *document fields)."""

    def __init__(self, embed_tokens):
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, inputs):
        return embed(self.embed_tokens, inputs)


class TiedWeight(nn.Layer):
    """The embedding's weight as fleet's shared layer: first stage (lookup) and last (head)."""

    def __init__(self, embed_tokens):
        super().__init__()
        self.weight = embed_tokens.weight
        self._embedding = [embed_tokens]  # not a sublayer: the weight above is its only parameter


class Block(nn.Layer):
    """One decoder layer; RoPE tables from the model's own rotary embedding."""

    def __init__(self, layer, rotary, parts: int = 1, rope_span: int = 1):
        super().__init__()
        self.layer, self._rotary, self.parts = layer, [rotary], parts  # parts: sequence shards of its input
        self.rope_span = rope_span  # context parallelism: positions (always passed) span rope_span x the chunks

    def forward(self, inputs):
        x, *doc = inputs if isinstance(inputs, tuple) else (inputs,)
        span = x.shape[1] * self.parts * (self.rope_span if doc else 1)  # the whole sequence's positions
        cos, sin = self._rotary[0](span)
        if doc:  # fleet frees what a stage sends; this stage's backward (and recompute) still reads its own
            return (self.layer(x, cos, sin, None, *doc),) + tuple(d.clone() for d in doc)
        return self.layer(x, cos, sin)


class Final(nn.Layer):
    """The final norm: the hidden states the loss reads (document fields end here)."""

    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, inputs):
        return self.norm(inputs[0] if isinstance(inputs, tuple) else inputs)


class Head(nn.Layer):
    """An untied LM head's weight on the last stage (the fused head + loss reads it in the loss)."""

    def __init__(self, lm_head):
        super().__init__()
        self.lm_head = lm_head

    def forward(self, h):
        return h


def embed(embed_tokens, inputs):
    ids, *doc = inputs if isinstance(inputs, tuple) else (inputs,)
    x = embed_tokens(ids)
    return (x,) + tuple(doc) if doc else x


def _tied_lookup(shared, inputs):
    return embed(shared._embedding[0], inputs)


def _tied_head(shared, h):
    return h


class StageLoss:
    """The last stage's loss: the model's own head + loss on the final hidden states. `sum_mode` (evaluation)
    returns the sum of token losses instead of their mean. Under context parallelism (`sequence`, the strategy's
    `context.ContextSide`) the sum is scaled by C and divided by the cp group's count, as `ContextModel` does."""

    __name__ = "StageLoss"

    def __init__(self, lm, sequence=None):
        self.lm, self.sequence, self.sum_mode = lm, sequence, False

    def __call__(self, h, labels):
        from pretrain_cli.ops.loss import mean_loss

        total, count = self.lm.loss_sum(h, labels)
        if self.sequence is not None:
            total, count = self.sequence.whole_sequence(total, count)
        return total if self.sum_mode else mean_loss(total, count)


def build_pipeline_layer(lm, parallel: ParallelConfig, backend, sequence=None):
    """fleet's PipelineLayer over `lm`'s own sublayers (the same parameter objects: nothing is copied); `backend`:
    the run's collectives (`distributed.comms.collectives`: on gloo the stage-pair groups, each with its own store);
    `sequence`: context parallelism's batch side (the loss over the cp group)."""
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import PipelineLayer, SharedLayerDesc

    dec, tied = lm.model, lm.lm_head is None
    items = [SharedLayerDesc("embed_tokens", TiedWeight, _tied_lookup, "weight", embed_tokens=dec.embed_tokens)
             if tied else Embed(dec.embed_tokens)]
    parts = parallel.tp_degree if parallel.sequence_parallel else 1  # after layer 0 the stream is cut (SP)
    span = lm.kernels.rope_span
    items += [Block(layer, dec.rotary_emb, parts if i else 1, span) for i, layer in enumerate(dec.layers)]
    items.append(Final(dec.norm))
    items.append(SharedLayerDesc("embed_tokens", TiedWeight, _tied_head, "weight", embed_tokens=dec.embed_tokens)
                 if tied else Head(lm.lm_head))
    pp, vpp = parallel.pp_degree, parallel.virtual_pp_degree
    bounds = stage_bounds(len(dec.layers), pp * vpp)  # one part per model chunk (a stage's, without virtual stages)
    seg = [0] + [b + 1 for b in bounds[1:-1]] + [len(items)]  # item 0 is the embedding
    if vpp > 1:  # fleet splits equal chunks itself (a list is read as P parts): config checks layers % (P x V) == 0
        seg = "layer:^Block$"
    loss = StageLoss(lm, sequence)
    hcg = fleet.get_hybrid_communicate_group()
    with backend.stores():  # the tied embedding's first-last stage group; on gloo the stage-pair groups
        layer = PipelineLayer(layers=items, num_stages=pp, loss_fn=loss, seg_method=seg, topology=hcg.topology(),
                              num_virtual_pipeline_stages=vpp)  # the run's Topology
        backend.neighbour_sends(hcg)
    return layer, loss, bounds
