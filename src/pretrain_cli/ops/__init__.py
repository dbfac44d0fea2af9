"""Kernels: `kernels` owns every fast/fallback choice (flash, fused GPU ops, the fused CPU kernels of
`cpu_ops` + `csrc/`) and their reference paths; `loss` is the fp32 causal-LM cross-entropy."""
