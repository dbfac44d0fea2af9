"""Talking between ranks: the run's one collectives backend, NCCL or gloo (`collectives`), gloo's workarounds
behind it (`gloo`), the TCP stores every process group meets through (`store`), ring attention's neighbour exchange
(`ring`), scalar agreement and rank-0 rounds (`comm`)."""
