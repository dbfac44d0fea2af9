"""Driver names (`nvidia-smi --query-gpu=name`, what `runtime.gpu_name` reads) matched to the hardware table: the
trainer's MFU and `plan`'s figures come from the entry, so a name must reach its own device's entry or none (no
MFU), never a neighbour's ("NVIDIA L40" is not the L4, "NVIDIA H100 NVL" not the SXM card)."""
import pytest

from pretrain_cli.planning import device_words, hardware

DRIVER_NAMES = {
    "Tesla V100-SXM2-16GB": "V100-16GB",
    "Tesla V100-SXM2-32GB": "V100-32GB",
    "Tesla V100-PCIE-32GB": None,  # 112 fp16 TFLOPS, not the SXM2's 125
    "Tesla V100S-PCIE-32GB": None,
    "Tesla T4": "T4",
    "NVIDIA A10": "A10",
    "NVIDIA A10G": None,  # AWS's variant, its own figures
    "NVIDIA A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB-PCIe",  # the datasheet's PCIe peaks and memory are the SXM4's; no NVSwitch
    "NVIDIA A100 80GB PCIe": "A100-80GB-PCIe",
    "NVIDIA A800-SXM4-80GB": "A800-80GB",
    "NVIDIA A800 80GB PCIe": "A800-80GB-PCIe",
    "NVIDIA A800-SXM4-40GB": None,  # the table has no 40 GB A800
    "NVIDIA L4": "L4",
    "NVIDIA L40": None,  # not the L4 (24 GB, 121 TFLOPS)
    "NVIDIA L40S": "L40S",
    "NVIDIA GeForce RTX 3090": "RTX3090",
    "NVIDIA GeForce RTX 3090 Ti": None,
    "NVIDIA GeForce RTX 4090": "RTX4090",
    "NVIDIA GeForce RTX 4090 D": None,
    "NVIDIA GeForce RTX 2080 Ti": None,
    "NVIDIA H100 80GB HBM3": "H100-SXM",  # the SXM5 card's name
    "NVIDIA H100 PCIe": "H100-PCIe",
    "NVIDIA H100 NVL": None,  # 94 GB, its own peak: not the SXM card's
    "NVIDIA H800": "H800",
    "NVIDIA H800 PCIe": None,  # not the SXM H800's figures
    "NVIDIA H20": "H20",
    "NVIDIA H200": "H200",
    "NVIDIA H200 NVL": None,
    "NVIDIA GH200 480GB": None,  # not the H200
    "NVIDIA B200": None,
    "NVIDIA GeForce RTX 4090 Laptop GPU": None,  # a laptop's chip, its own clocks and memory
    "Tesla V100-DGXS-32GB": None,  # the DGX Station's V100
    "NVIDIA H20 SXM HBM3": "H20",
}


@pytest.mark.parametrize("name", sorted(DRIVER_NAMES))
def test_a_driver_name_reaches_its_own_entry_or_none(name):
    entry = hardware.lookup(name)
    assert (entry.name if entry is not None else None) == DRIVER_NAMES[name]


def test_the_names_plan_accepts_still_resolve():
    """`plan --device`: the table's names in any case, the aliases, spaces for dashes."""
    for entry in hardware.DEVICES.values():
        assert hardware.lookup(entry.name) is entry and hardware.lookup(entry.name.upper()) is entry
    for alias, key in hardware.ALIASES.items():
        assert hardware.lookup(alias) is hardware.DEVICES[key]
    assert hardware.lookup("rtx 4090").name == "RTX4090" and hardware.lookup("a100 40gb").name == "A100-40GB"
    assert hardware.lookup("H100 SXM").name == "H100-SXM" and hardware.lookup("cpu") is None


def test_an_unmatched_driver_name_gets_no_mfu():
    """The trainer's MFU (`training.metrics.resolve_peak`, then `hardware.resolve_peak`): no entry, no peak, the name
    said."""
    peak, why = hardware.resolve_peak(hardware.lookup("NVIDIA L40"), "NVIDIA L40", "bfloat16")
    assert peak is None and why == "NVIDIA L40 has no table entry"
    peak, why = hardware.resolve_peak(hardware.lookup("NVIDIA H100 80GB HBM3"), "NVIDIA H100 80GB HBM3", "bfloat16")
    assert peak == 989.0 and "H100-SXM dense bf16" in why


@pytest.mark.parametrize("name, entry", [("a100-80g", "A100-80GB"), ("A100-40G", "A100-40GB"), ("v100-16g", "V100-16GB"),
                                         ("h100sxm", "H100-SXM"), ("a800-80g", "A800-80GB"), ("a100 80", "A100-80GB"),
                                         ("h100pcie", "H100-PCIe"), ("A100 40GB SXM4", "A100-40GB"),
                                         ("a100pcie 40g", "A100-40GB-PCIe"), ("A100-80GB-PCIe", "A100-80GB-PCIe")])
def test_informal_spellings_reach_their_entry(name, entry):
    """A memory size typed with G, GB or no unit, a form factor glued to the model: one entry, so that one."""
    assert hardware.lookup(name).name == entry


@pytest.mark.parametrize("name", ["a100 81", "a100-81g", "v100 pcie", "h100nvl", "a10g"])
def test_a_spelling_of_no_entry_stays_refused(name):
    assert hardware.lookup(name) is None


def test_a_pcie_card_of_an_nvlink_entry_is_planned_over_pcie():
    """The A100/A800 PCIe cards' NVLink is a bridge between two cards, not the SXM4 board's link to all eight: the
    planner's in-node link is PCIe 4.0 x16, with the SXM4 entry's peak, memory and capability."""
    sxm, pcie = hardware.lookup("NVIDIA A100-SXM4-80GB"), hardware.lookup("NVIDIA A100 80GB PCIe")
    assert hardware.links(sxm).in_node_gbps == 300.0 and hardware.links(pcie).in_node_gbps == 31.5
    assert hardware.links(pcie).source == "A100-80GB-PCIe PCIe 4.0 x16, one way"
    assert (pcie.memory_gib, pcie.bf16_tflops, pcie.capability) == (sxm.memory_gib, sxm.bf16_tflops, sxm.capability)
    assert hardware.lookup(pcie.name) == pcie  # the name `train`'s out-of-memory line gives `plan --device`


def test_plan_suggests_no_listed_card_of_the_family_a_name_has_no_entry_in():
    """`plan --device "H100 NVL"` once asked "did you mean H100?", the SXM card whose figures the NVL's are not."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning import device_names
    from pretrain_cli.planning.plan import target_device

    listed = ", ".join(device_names.listed())
    for name, kin in (("H100 NVL", "H100-SXM and H100-PCIe are other cards"), ("GH200", "H200 is another card"),
                      ("NVIDIA L40", "L4 is another card"), ("A10G", "A10 is another card"),
                      ("A100 120GB", "A100-40GB and A100-80GB are other cards"), ("V100 PCIe", "V100-16GB and "
                      "V100-32GB are other cards"), ("RTX 3090 Ti", "RTX3090 is another card")):
        with pytest.raises(UserError) as e:
            target_device(name)
        assert str(e.value) == (f"--device: {name!r} has no table entry ({kin}, with other figures); plan it as a "
                                f"listed device with no more memory than it has, and its dense peak as --peak_tflops "
                                f"N; listed: {listed} or cpu")
    with pytest.raises(UserError, match=r"unknown device 'H10' \(did you mean H100, H20 or A10\?\); use one of "):
        target_device("H10")



@pytest.mark.parametrize("name, entry", [("A100 80 GB", "A100-80GB"), ("H100 80 GB", "H100-SXM"),
                                         ("h200 141 gb", "H200"), ("T4 PCIe", "T4"), ("L40S PCIe", "L40S"),
                                         ("A10 PCIe", "A10"), ("L4 PCIe", "L4"), ("RTX 4090 24 GB", "RTX4090"),
                                         ("NVIDIA A100 80 GB PCIe", "A100-80GB-PCIe")])
def test_a_size_in_two_words_and_a_pcie_only_cards_form_reach_their_entry(name, entry):
    """They were refused as "another card, with other figures" (review R9 on ad22cdca): a size typed "80 GB" is
    one memory size; T4, A10, L4, L40S and the RTX cards are PCIe cards, so "pcie" names the entry itself."""
    from pretrain_cli.planning.plan import target_device

    assert hardware.lookup(name).name == entry and target_device(name).name == entry


@pytest.mark.parametrize("name, near", [("A100-80GBB", "A100-80GB, A100-40GB or A100-80GB-PCIe"),
                                        ("H1000", "H100, V100 or H800")])
def test_a_typo_of_a_listed_card_gets_the_nearest_names_not_the_other_card_line(name, near):
    """No mark of another card (NVL, a glued letter, a size or form its model lacks, a known name): a typo, answered
    with the nearest names (it was "A100-40GB and A100-80GB are other cards, with other figures"), the model's own
    where the name starts with a listed model (not the A800-80GB for "A100-80GBB")."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning.plan import target_device

    with pytest.raises(UserError) as e:
        target_device(name)
    assert str(e.value).startswith(f"--device: unknown device {name!r} (did you mean {near}?); use one of "), e.value


def test_a_pcie_card_planned_from_an_nvlink_entry_names_its_pcie_siblings_and_is_listed():
    """`plan --device "A100 PCIe"` named the SXM4 entries A100-40GB and A100-80GB as its other variants, and the
    names `lookup` plans over PCIe were missing from "listed:"."""
    from pretrain_cli.planning import device_names
    from pretrain_cli.planning.plan import device_note, target_device

    assert device_note("A100 PCIe", target_device("A100 PCIe")) == [
        "device: --device A100 PCIe is planned as A100-80GB-PCIe (80 GiB, 312 TFLOPS half precision); name "
        "A100-40GB-PCIe for another variant"]
    assert device_note("H100", target_device("H100"))[0].endswith("; name H100-PCIe for another variant")
    listed = device_names.listed()
    assert listed[listed.index("A100-40GB"):listed.index("A800-80GB") + 2] == [
        "A100-40GB", "A100-40GB-PCIe", "A100-80GB", "A100-80GB-PCIe", "A800-80GB", "A800-80GB-PCIe"]
    assert all(hardware.lookup(n).name == n for n in listed)


@pytest.mark.parametrize("name, entry", [("4090 PCIe", "RTX4090"), ("3090 PCIe", "RTX3090"), ("4090 24GB", "RTX4090"),
                                         ("GeForce 4090", "RTX4090"), ("L40 S", "L40S"), ("l40-s", "L40S"),
                                         ("H20 SXM", "H20"), ("H20 HBM3", "H20"), ("NVIDIA H100 GPU", "H100-SXM")])
def test_a_models_alias_a_split_letter_and_the_h20s_forms_reach_their_entry(name, entry):
    """Review R12: "4090 PCIe" asked "did you mean H100-PCIe?" and "GeForce 4090" got no suggestion (`lookup` read
    the model word without its alias), "L40 S" was "L4 is another card", "H20 SXM" another card than the H20 (an
    SXM module only); a driver name's "GPU" names no card."""
    from pretrain_cli.planning.plan import target_device

    assert hardware.lookup(name).name == entry and target_device(name).name == entry


@pytest.mark.parametrize("name, kin", [("A10 G", "A10 is another card"), ("GH 200", "H200 is another card"),
                                       ("V100 S", "V100-16GB and V100-32GB are other cards"),
                                       ("RTX 4090 Laptop GPU", "RTX4090 is another card"),
                                       ("Tesla V100-DGXS-32GB", "V100-16GB and V100-32GB are other cards"),
                                       ("H20 HBM3e", "H20 is another card")])
def test_another_cards_word_after_a_listed_model_is_its_mark(name, kin):
    """Review R12: these were typos ("did you mean A10 or A100?", "did you mean V100-32GB?"): the card with the
    wrong figures. A word after a listed model that is no form or size, nor close to one, makes another card."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning.plan import target_device

    with pytest.raises(UserError) as e:
        target_device(name)
    assert str(e.value).startswith(f"--device: {name!r} has no table entry ({kin}, with other figures); "), e.value


@pytest.mark.parametrize("name, near", [("H100 PCI", "H100-PCIe or H100"), ("a100 pcle", "A100, A100-80GB-PCIe or "
                                                                                        "A100-40GB-PCIe")])
def test_a_typo_of_a_form_after_a_listed_model_gets_that_models_names(name, near):
    """A word close to a form stays a typo; "a100 pcle" was offered H100-PCIe first, another model."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning.plan import target_device

    with pytest.raises(UserError) as e:
        target_device(name)
    assert str(e.value).startswith(f"--device: unknown device {name!r} (did you mean {near}?); use one of "), e.value


@pytest.mark.parametrize("name", ["H100 S", "H100 E", "h100-s"])
def test_a_lone_letter_making_no_card_is_a_typo(name):
    """A letter after the model is another card's mark only where the two name one (L40S, A10G, V100S, T4G,
    A100X, RTX 4090 D): "H100 S" was "H100-SXM and H100-PCIe are other cards", no name offered."""
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning.plan import target_device

    assert device_words.words(name) == ["h100", name[-1].lower()]
    with pytest.raises(UserError) as e:
        target_device(name)
    assert str(e.value).startswith(f"--device: unknown device {name!r} (did you mean H100"), e.value


@pytest.mark.parametrize("name, kin", [("T4 G", "T4 is another card"), ("RTX 4090 D", "RTX4090 is another card"),
                                       ("A100 X", "A100-40GB and A100-80GB are other cards")])
def test_a_lone_letter_making_a_card_is_its_mark(name, kin):
    from pretrain_cli.errors import UserError
    from pretrain_cli.planning.plan import target_device

    with pytest.raises(UserError) as e:
        target_device(name)
    assert str(e.value).startswith(f"--device: {name!r} has no table entry ({kin}, with other figures); "), e.value


def test_plan_help_lists_the_names_plan_takes():
    """--help's "known:" list was the table's entries without the PCIe cards `plan` plans (A100-80GB-PCIe)."""
    import argparse

    from pretrain_cli.commands import plan as plan_command
    from pretrain_cli.planning import device_names

    parser = argparse.ArgumentParser()
    plan_command.add_arguments(parser)
    (device,) = [a for a in parser._actions if "--device" in a.option_strings]
    assert f"(known: {', '.join(device_names.listed())};" in device.help and "A100-80GB-PCIe" in device.help
