"""benchmarks/step_regions.py: each profiler event lands in exactly one region, each region's floor term is its
Linears' GEMMs (layer Linears once per layer, the head once), attention's term and AdamW's against the rest."""
from bench_scripts import load


def _module():
    return load("step_regions")


def test_every_event_lands_in_one_region_and_the_terms_follow_the_linears():
    m = _module()
    own = {("Forward", "CausalLM"): 0.090, ("Operator", "Global_GradNodePyLayer_FusedLinearLoss"): 0.001,
           ("Forward", "MLP"): 0.037, ("Operator", "Global_CustomOpGradNode: pcl_mlp_in_grad"): 0.047,
           ("Operator", "Global_CustomOpGradNode: pcl_linear_residual_grad"): 0.021,
           ("Forward", "Attention"): 0.011, ("Operator", "Global_CustomOpGradNode: pcl_attn_in_grad"): 0.019,
           ("Forward", "DecoderLayer"): 0.007,
           ("Operator", "Global_CustomOpGradNode: pcl_linear_add_rms_norm_grad"): 0.011,
           ("Forward", "CoreAttention"): 0.010,
           ("Operator", "Global_CustomOpGradNode: pcl_causal_attention_grad"): 0.015,
           ("Forward", "RMSNorm"): 0.0014, ("ProfileStep", "ProfileStep#0"): 0.0100}
    gemm = {"q": 0.002, "k": 0.001, "v": 0.001, "o": 0.0025, "gate|up": 0.013, "down": 0.0065, "head": 0.080}
    rows = m.regions(own, gemm, layers=4, attention_s=0.0098, adamw_s=0.0034)
    by = {name: (t, term) for name, t, term in rows}
    assert [name for name, _, _ in rows] == [r[0] for r in m.REGIONS] + [m.REST]
    assert abs(sum(t for _, t, _ in rows) - sum(own.values())) < 1e-12  # nothing counted twice or lost
    head, mlp, qkv, o, attn = (by[r[0]] for r in m.REGIONS)
    assert head == (0.091, 0.080)  # the head counted once, not per layer
    assert abs(mlp[0] - 0.105) < 1e-12 and abs(mlp[1] - 4 * 0.0195) < 1e-12
    assert abs(qkv[0] - 0.030) < 1e-12 and abs(qkv[1] - 4 * 0.004) < 1e-12  # "Attention", not "CoreAttention"
    assert abs(o[1] - 4 * 0.0025) < 1e-12
    assert attn == (0.025, 0.0098)
    assert abs(by[m.REST][0] - 0.0114) < 1e-12 and by[m.REST][1] == 0.0034
