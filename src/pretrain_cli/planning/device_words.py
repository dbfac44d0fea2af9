"""How a GPU name's words are read: its model, form factor and memory size, as `hardware.lookup` matches them against
the table's entries and `device_names` words a refusal of one. Apart from the table (`hardware`), which reads names
through it: a driver's name ("NVIDIA A100-SXM4-80GB") and a user's ("a100 80gb") are read one way.
"""
from __future__ import annotations

import re

# The form factors each entry's figures are the datasheet's for, as driver names spell them ("NVIDIA A100 80GB PCIe",
# "NVIDIA H100 80GB HBM3": the SXM5 card). The A100/A800 datasheets give the PCIe cards the SXM4 ones' peaks and
# memory, but their NVLink is a bridge between two cards, not the SXM4 board's NVSwitch to all eight:
# `hardware.lookup` gives a PCIe card its entry with no NVLink (A100-80GB-PCIe), so `hardware.links` plans its
# node's GPUs over PCIe 4.0 x16. A V100 PCIe (112 fp16 TFLOPS), an H800 PCIe, an H100 NVL or an H200 NVL has its own
# figures, not in the table: a name with a form factor its entry lacks (or any other word) matches nothing. T4, A10,
# L4, L40S and the RTX cards are PCIe only; the H20 (96 GB HBM3) comes only on an HGX board's SXM modules.
FORMS = {"V100-16GB": {"sxm", "sxm2"}, "V100-32GB": {"sxm", "sxm2"}, "A100-40GB": {"sxm", "sxm4", "pcie"},
         "A100-80GB": {"sxm", "sxm4", "pcie"}, "A800-80GB": {"sxm", "sxm4", "pcie"},
         "H100-SXM": {"sxm", "sxm5", "hbm3"}, "H100-PCIe": {"pcie"}, "H800": {"sxm", "sxm5", "hbm3"},
         "H20": {"sxm", "hbm3"}, "H200": {"sxm", "hbm3e"}} | {
             n: {"pcie"} for n in ("T4", "A10", "L4", "L40S", "RTX3090", "RTX4090")}
_MAKERS = {"nvidia", "tesla", "geforce", "gpu"}  # words of a driver's name that name no device
MEMORY_WORD = re.compile(r"(\d+)(?:gb|g|gib)?")  # a memory size word: "80GB", informally "80G" or "80"
GLUED_FORM = re.compile(r"(.+?)(sxm\d?|pcie|nvl)")  # a form factor glued to the model: "h100sxm", "a100pcie"
LETTERED = {"l40s", "a10g", "v100s", "rtx4090d", "t4g", "a100x"}  # cards named as a model and one letter


def words(name: str) -> list[str]:
    """`name`'s words as `hardware.lookup` matches them: lower case, makers' words dropped, "RTX 4090" one model
    word, a memory size typed as two words ("80 GB") one, and a lone letter after the model part of it where the two
    name a real card (`LETTERED`: "L40 S" is the L40S, "A10 G" the A10G: read apart, the model would be another card's;
    "H100 S" is no card, a typo)."""
    said = [w for w in re.split(r"[\s_-]+", name.lower()) if w and w not in _MAKERS]
    if said[:1] == ["rtx"] and len(said) > 1:  # "GeForce RTX 4090": the table's RTX4090
        said = ["rtx" + said[1], *said[2:]]
    for i in range(len(said) - 1, 0, -1):
        if said[i] in ("gb", "g", "gib") and said[i - 1].isdigit():
            said[i - 1:i + 1] = [said[i - 1] + said[i]]
    if len(said) > 1 and len(said[1]) == 1 and said[0] + said[1] in LETTERED:
        said[:2] = [said[0] + said[1]]
    return said


def read(name: str, models: dict[str, str]) -> tuple[str, list[str]] | None:
    """(the table's model `name` names, its other words) as `hardware.lookup` matches them, a form factor glued to
    the model split off ("h100sxm": h100, sxm); `models`: `hardware.model_words()`. None for a name of no words."""
    said = words(name)
    if not said:
        return None
    model, rest = said[0], said[1:]
    glued = GLUED_FORM.fullmatch(model)
    if glued and model not in models:
        model, rest = glued[1], [glued[2], *rest]
    return models.get(model, model), rest
