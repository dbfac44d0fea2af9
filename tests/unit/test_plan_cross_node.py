"""The cross-node link `plan` assumes by GPU generation (`hardware.CROSS_NODE_GBPS`): every device of the table is
planned, and a capability the table does not hold takes the nearest generation's figure instead of failing."""
import dataclasses

from pretrain_cli.planning import hardware


def test_every_table_device_gets_its_generations_link():
    """Every entry is planned (a table entry of a generation the link table lacks raised KeyError); those of a
    generation it holds get that figure."""
    for device in hardware.DEVICES.values():
        major = device.capability[0]
        got = hardware.links(device).cross_node_gbps
        assert got == hardware.cross_node_gbps(major), device.name
        assert major not in hardware.CROSS_NODE_GBPS or got == hardware.CROSS_NODE_GBPS[major], device.name


def test_a_capability_outside_the_table_takes_the_nearest_generation():
    """A Blackwell (10.0) or a newer reported capability: the newest figure (50); a Pascal (6.0): the oldest."""
    newest, oldest = max(hardware.CROSS_NODE_GBPS), min(hardware.CROSS_NODE_GBPS)
    h100 = hardware.lookup("H100")
    for cap, want in (((10, 0), hardware.CROSS_NODE_GBPS[newest]), ((12, 0), hardware.CROSS_NODE_GBPS[newest]),
                      ((6, 0), hardware.CROSS_NODE_GBPS[oldest])):
        future = dataclasses.replace(h100, capability=cap)
        assert hardware.links(future).cross_node_gbps == want, cap
    assert hardware.links(h100, hardware.Node(8, 12.0)).cross_node_gbps == 12.0  # given: kept
