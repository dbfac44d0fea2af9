"""The layout steps, applied from outside to the finished single-device model in one fixed order (`order`):
tp (`tensor_parallel`, with `sequence_parallel`'s regions), cp (`context`), ep (registered by
`steps.expert_parallel`), recompute, pp (`pipeline_stages`), data (its build side:
`local_kernels`)."""
