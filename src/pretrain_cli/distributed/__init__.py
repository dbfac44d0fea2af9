"""Everything about processes: what the launcher said (`launch`), joining the group and spreading a
finished model over it (`strategy`), scalar agreement and rank-0 rounds (`comm`), dead-peer detection
(`watchdog`). Model code never knows about any of it."""
