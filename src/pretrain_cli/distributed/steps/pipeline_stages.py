"""The pipeline cut (the `pp` step of `distributed.steps.order`): the finished model's own sublayers as fleet
`PipelineLayer` items, and the last stage's loss.

The items: the embedding (or, tied, fleet's `SharedLayerDesc` of its weight on the first and last stage), one
item per decoder layer, the final norm, the LM head's weight. `models.stages.stage_bounds` splits the decoder layers
over the stages as evenly as they go (the embedding rides with the first, the norm and head with the last).
Packed-document fields (`position_ids`, `doc_start`) travel between stages with the hidden states.

DeepSeek-V3's multi-token prediction (`models.mtp`) runs in the last stage's loss, as the loss needs the labels:
its modules are an item there (`MTPModules`), the input ids travel with the hidden states (after the document
fields; depth k looks up the ids k positions on, which the labels cannot give where they are ignored), and the
embedding's table is on the last stage too as fleet's `SharedLayerDesc` (a tied head's copy already is; else one of
its own), its gradient summed with the first stage's by fleet, as Megatron-Core keeps an embedding there for MTP.

A Mixture-of-Experts model's router losses (`models.moe_loss`) span every stage's layers, while fleet
backpropagates the last stage's loss only: their sums over the layers (`RouterStream`) travel last in the stream,
each stage adding its layers' (with gradient: fleet sends back the gradients of a tuple's tensors that do not stop
gradient), and the last stage forms the losses from them as one process does from all its layers.

Imported by the layout steps only, after the environment is set (paddle is imported at the top).
"""
from __future__ import annotations

import functools

import paddle
import paddle.nn as nn

from pretrain_cli.models.moe_loss import RouterSums, add_sums, layer_sums, router_loss, router_terms, sparse_blocks
from pretrain_cli.models.stages import last_stage_embeds, stage_bounds
from pretrain_cli.run_layout import ParallelConfig


class RouterStream:
    """A MoE model's router-loss sums (`models.moe_loss.RouterSums`) as the two tensors that end the stream: fp32
    `[experts + 2]` with gradient (the softmax probability sums, the z-loss sum, the sequence-wise loss sum) and fp32
    `[experts]` without (the top-k choice counts: no gradient, so fleet sends none back). The first stage starts them
    at zero, every `Block` adds its layer's sums in layer order (only in training), the last stage's loss adds the
    MTP modules' and forms the losses (`models.moe_loss.router_loss(lm, carried, blocks)`): the same additions in
    the same order as one process (whose first is onto nothing rather than 0: the same bits). Both tensors always travel
    (a stage without sparse layers passes copies on), whatever terms are on. The first starts with gradient even before
    any sparse layer adds to it, so every send of a stage has the same `stop_gradient` pattern whatever layers precede
    it: fleet's interleaved schedule checks each send of a step against the first one's
    (`SendRecvMeta.check_send_message` counts only the tensors with gradient), and a stage holding a dense chunk
    (DeepSeek's first layers) and a sparse one sent the sums without gradient from the one and with from the other (an
    AssertionError at the first step of pp 4 x virtual_pp_degree 2)."""

    def __init__(self, lm):
        self.terms, self.experts = router_terms(lm), lm.config.num_experts
        self.layers = sum(len(sparse_blocks(layer)) for layer in lm.model.layers)  # the decoder's sparse layers

    def start(self) -> tuple:
        vec = paddle.zeros([self.experts + 2], dtype="float32")
        vec.stop_gradient = False  # (its gradient, sent back to the first stage, reaches nothing: a zero leaf)
        return vec, paddle.zeros([self.experts], dtype="float32")

    def add(self, vec, counts, blocks: list) -> tuple:
        """The carried sums plus those of `blocks` (a copy when none: fleet frees what a stage sends)."""
        if not blocks:
            return vec.clone(), counts.clone()
        sums = self.unpack(vec, counts)
        for b in blocks:
            sums = add_sums(sums, layer_sums(b, self.terms))
        prob_sum, counts, z_sum, seq_sum, _, _ = sums
        return paddle.concat([prob_sum, z_sum.reshape([1]), seq_sum.reshape([1])]), counts  # [experts + 2]

    def unpack(self, vec, counts, tokens: int = 0) -> RouterSums:
        """`tokens` of a micro-batch: the last stage's row count of every decoder layer (P_e's denominator)."""
        e = self.experts
        return RouterSums(vec[:e], counts, vec[e], vec[e + 1], self.layers, self.layers * tokens)


class Embed(nn.Layer):
    """First stage: token ids (+ document fields) -> (hidden, *document fields[, ids][, router sums])."""

    def __init__(self, embed_tokens, carry_ids: bool = False, router: RouterStream | None = None):
        super().__init__()
        self.embed_tokens, self.carry_ids, self.router = embed_tokens, carry_ids, router

    def forward(self, inputs):
        return embed(self.embed_tokens, inputs, self.carry_ids, self.router)


class TiedWeight(nn.Layer):
    """The embedding's weight as fleet's shared layer: first stage (lookup) and last (head)."""

    def __init__(self, embed_tokens):
        super().__init__()
        self.weight = embed_tokens.weight
        self._embedding = [embed_tokens]  # not a sublayer: the weight above is its only parameter


class Block(nn.Layer):
    """One decoder layer; RoPE tables from the model's own rotary embedding."""

    def __init__(self, layer, rotary, parts: int = 1, rope_span: int = 1, carry_ids: bool = False,
                 router: RouterStream | None = None):
        super().__init__()
        self.layer, self._rotary, self.parts = layer, [rotary], parts  # parts: sequence shards of its input
        self.rope_span = rope_span  # context parallelism: positions (always passed) span rope_span x the chunks
        self.carry_ids = carry_ids  # the input ids ride in the stream, for the last stage's MTP
        self.router, self._moe = router, sparse_blocks(layer)  # the router sums ride last; this layer's MoE block

    def forward(self, inputs):
        x, *doc = inputs if isinstance(inputs, tuple) else (inputs,)
        sums = [doc.pop(-2), doc.pop()] if self.router is not None else []
        ids = [doc.pop()] if self.carry_ids else []
        span = x.shape[1] * self.parts * (self.rope_span if doc else 1)  # the whole sequence's positions
        cos, sin = self._rotary[0](span)
        out = self.layer(x, cos, sin, None, *doc) if doc else self.layer(x, cos, sin)
        # fleet frees what a stage sends; this stage's backward (and recompute) still reads its own
        rest = tuple(t.clone() for t in doc + ids)
        if sums:  # evaluation adds nothing (its loss has no router terms)
            rest += self.router.add(*sums, self._moe if self.training else [])
        return (out,) + rest if rest else out


class Final(nn.Layer):
    """The final norm: the hidden states the loss reads (document fields end here, unless the loss reads what
    follows them: MTP's ids, the router sums: `carry`)."""

    def __init__(self, norm, carry: bool = False):
        super().__init__()
        self.norm, self.carry = norm, carry

    def forward(self, inputs):
        x, *rest = inputs if isinstance(inputs, tuple) else (inputs,)
        return (self.norm(x), *rest) if self.carry else self.norm(x)


class Head(nn.Layer):
    """An untied LM head's weight on the last stage (the fused head + loss reads it in the loss)."""

    def __init__(self, lm_head):
        super().__init__()
        self.lm_head = lm_head

    def forward(self, h):
        return h


class MTPModules(nn.Layer):
    """The multi-token prediction modules as a last-stage item, so they are this stage's parameters; the loss runs
    them (`StageLoss`), the stream passes through. Its `training` flag is the schedule's (train or eval)."""

    def __init__(self, modules: list):
        super().__init__()
        self.mtp = nn.LayerList(modules)

    def forward(self, inputs):
        return inputs


def embed(embed_tokens, inputs, carry_ids: bool = False, router: RouterStream | None = None):
    ids, *doc = inputs if isinstance(inputs, tuple) else (inputs,)
    x = embed_tokens(ids)
    rest = tuple(doc) + ((ids.clone(),) if carry_ids else ())  # a copy: fleet frees what it sends, the lookup's
    rest += router.start() if router is not None else ()  # backward reads the ids
    return (x,) + rest if rest else x


def _tied_lookup(shared, inputs, carry_ids: bool = False, router: RouterStream | None = None):
    return embed(shared._embedding[0], inputs, carry_ids, router)


def _tied_head(shared, h):
    """The last stage's copy of the embedding (a tied head, MTP's lookups): the loss reads it, the stream passes."""
    return h


class StageLoss:
    """The last stage's loss: the model's own head + loss on the final hidden states. `sum_mode` (evaluation)
    returns the sum of token losses instead of their mean. Under context parallelism (`sequence`, the strategy's
    `context.ContextSide`) the sum is scaled by C and divided by the cp group's count, as `ContextModel` does.
    In training with MTP modules (`mtp`, their item) the stream is (hidden, *document fields, ids) and the MTP
    term is added per counted token as `CausalLM.forward` adds it (`models.mtp.mtp_term`). With the router sums
    (`router`, its `RouterStream`; `final` the item whose mode is the schedule's) they end the stream, and the
    router losses are added after the MTP term as `CausalLM.forward` adds them: the MTP modules' sparse layers'
    sums added to the carried ones, then `models.moe_loss.router_loss`."""

    __name__ = "StageLoss"

    def __init__(self, lm, sequence=None, mtp: MTPModules | None = None, router: RouterStream | None = None,
                 final: nn.Layer | None = None):
        self.lm, self.sequence, self.sum_mode, self.mtp = lm, sequence, False, mtp
        self.router, self._final = router, [final]

    def __call__(self, out, labels):
        from pretrain_cli.ops.loss import mean_loss

        h, *rest = out if isinstance(out, tuple) else (out,)
        sums = [rest.pop(-2), rest.pop()] if self.router is not None else []
        total, count = self.lm.loss_sum(h, labels)
        if self.sequence is not None:
            total, count = self.sequence.whole_sequence(total, count)
        final = self._final[0]  # its mode is the schedule's; without it (an item-level test) the MTP modules'
        training = final.training if final is not None else self.mtp is not None and self.mtp.training
        if training and (self.lm.sparse or self.lm.mtp_depth):  # the LM part, logged apart as lm_loss
            from pretrain_cli.models.moe_loss import add_lm_loss

            add_lm_loss(self.lm, total, count)
        if self.mtp is not None and self.mtp.training:
            from pretrain_cli.models.mtp import mtp_term

            *doc, ids = rest  # doc: (position_ids[, doc_start]) or none
            total = total + mtp_term(self.lm, h, ids, labels, *doc) * count.detach().astype(total.dtype)
        if sums and self._final[0].training:
            carried = self.router.unpack(*sums, labels.shape[0] * labels.shape[1])
            blocks = sparse_blocks(self.mtp) if self.mtp is not None else []
            total = total + router_loss(self.lm, carried, blocks) * count.detach().astype(total.dtype)
        return total if self.sum_mode else mean_loss(total, count)


def build_pipeline_layer(lm, parallel: ParallelConfig, backend, sequence=None):
    """fleet's PipelineLayer over `lm`'s own sublayers (the same parameter objects: nothing is copied); `backend`:
    the run's collectives (`distributed.comms.collectives`: on gloo the stage-pair groups, each with its own store);
    `sequence`: context parallelism's batch side (the loss over the cp group)."""
    from paddle.distributed import fleet
    from paddle.distributed.fleet.meta_parallel import PipelineLayer, SharedLayerDesc

    dec, tied, mtp = lm.model, lm.lm_head is None, bool(lm.mtp_depth)
    router = RouterStream(lm) if lm.sparse and router_terms(lm).on else None
    shared = functools.partial(SharedLayerDesc, "embed_tokens", TiedWeight, shared_weight_attr="weight",
                               embed_tokens=dec.embed_tokens)  # one table on the first and the last stage
    items = [shared(forward_func=functools.partial(_tied_lookup, carry_ids=mtp, router=router))
             if last_stage_embeds(lm.config) else Embed(dec.embed_tokens, mtp, router)]
    parts = parallel.tp_degree if parallel.sequence_parallel else 1  # after layer 0 the stream is cut (SP)
    span = lm.kernels.rope_span
    items += [Block(layer, dec.rotary_emb, parts if i else 1, span, mtp, router)
              for i, layer in enumerate(dec.layers)]
    final = Final(dec.norm, mtp or router is not None)
    items.append(final)
    items.append(shared(forward_func=_tied_head) if tied else Head(lm.lm_head))
    modules = MTPModules(dec.layers.mtp) if mtp else None
    if mtp:
        items += [modules] + ([] if tied else [shared(forward_func=_tied_head)])  # untied: the table's own copy
    pp, vpp = parallel.pp_degree, parallel.virtual_pp_degree
    bounds = stage_bounds(len(dec.layers), pp * vpp)  # one part per model chunk (a stage's, without virtual stages)
    seg = [0] + [b + 1 for b in bounds[1:-1]] + [len(items)]  # item 0 is the embedding
    if vpp > 1:  # fleet splits equal chunks itself (a list is read as P parts): config checks layers % (P x V) == 0
        seg = "layer:^Block$"
    loss = StageLoss(lm, sequence, modules, router, final)
    hcg = fleet.get_hybrid_communicate_group()
    with backend.stores():  # the shared embedding's first-last stage group; on gloo the stage-pair groups
        layer = PipelineLayer(layers=items, num_stages=pp, loss_fn=loss, seg_method=seg, topology=hcg.topology(),
                              num_virtual_pipeline_stages=vpp)  # the run's Topology
        backend.neighbour_sends(hcg)
    return layer, loss, bounds
