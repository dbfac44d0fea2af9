"""The strategies: the data side of each layout (`strategy`: one process, data parallel, fleet's ZeRO-1;
`hybrid` over fleet's groups, `pipeline` and `tensor_engine` on it; `semi_auto`: ZeRO-2/3 and TP, with `zero3`'s
sharding stage; `expert_parallel`): each creates its rank's parameters, runs the layout steps, and owns
gradients, norm, optimizer state and checkpoint pieces."""
