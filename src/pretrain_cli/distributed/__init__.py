"""Everything about processes, in sub-packages that are layers (each imports only the ones before it;
tests/unit/test_layers.py): `launcher` (what the launcher said, a job's ports and verdicts, progress records and
the watchers; no Paddle at import) → `comms` (the one collectives backend and gloo's workarounds, the ring's
neighbour exchange, scalar agreement) → `layout` (the rank topology, the pieces a rank holds, creating them) →
`steps` (the layout steps in their order: tp, cp, ep, recompute, pp, data) → `strategies` (the data side of each
layout) → `setup` (join the group, choose the strategy). Model code never knows about any of it."""
