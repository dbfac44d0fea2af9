"""What `plan --device` says of a GPU name: the names it lists, the other variants of the one it planned, and why
a name it has no entry for is refused.

A name the table does not hold is either a typo of a listed one ("A100-80GBB", "H1000"), answered with the nearest
names, or another card of a listed model ("H100 NVL", "GH200", "L40"), whose figures are not that model's: naming a
listed card for it would plan the wrong memory and peak, so the refusal says it is another card and suggests none.
`hardware.lookup` decides which entry a name is, from its words as `device_words` reads them; this module only words
what `plan` tells the user.
"""
from __future__ import annotations

import re

from pretrain_cli.planning import hardware
from pretrain_cli.planning.device_words import FORMS, GLUED_FORM, MEMORY_WORD, words

# words that make another card of a listed model ("H100 NVL", "RTX 3090 Ti", "RTX 4090 D")
OTHER_WORDS = {"nvl", "ti", "super", "d"}
# other cards named as a listed model with a digit added, which a typo cannot be told from ("L40" is not the L4,
# "H1000" is a typo of the H100): named here one by one
OTHER_MODELS = {"l40": "l4"}
_FORM = re.compile(r"sxm\d?|pcie|hbm\d?e?")  # a form factor word (`FORMS`)


def listed() -> list[str]:
    """The names `plan --device` lists: the table's entries, each with NVLink and a PCIe card (`FORMS`)
    followed by that card's name, which `hardware.lookup` plans over PCIe (A100-80GB, A100-80GB-PCIe)."""
    return [n for d in hardware.DEVICES.values() for n in (d.name, f"{d.name}-PCIe")
            if n == d.name or (d.nvlink_gbps and "pcie" in FORMS.get(d.name, ()))]


def variants(entry: hardware.Device) -> list[str]:
    """The listed names of `entry`'s model other than its own, of its form: a PCIe card planned from an NVLink entry
    (A100-80GB-PCIe) has the model's other such cards (A100-40GB-PCIe); a table entry the model's other entries."""
    model, derived = entry.name.split("-")[0], entry.name.lower() not in hardware.DEVICES
    return [n for n in listed() if n.split("-")[0] == model and n != entry.name
            and (n.lower() not in hardware.DEVICES) == derived]


def family_entries(name: str) -> list[hardware.Device]:
    """The table's entries of the model `name` spells out, for a `name` `hardware.lookup` finds no entry for that
    carries a mark of another card of that model: a word such cards add (`OTHER_WORDS`: "H100 NVL"), a letter glued
    to the model ("GH200" or "GH 200" is not the H200, "A10G" not the A10), a memory size or form factor none of the
    model's entries has ("A800 40GB", "V100 PCIe"), a name in `OTHER_MODELS` ("L40"), or after a listed model any
    other word of two letters or more not close to a form or size (`_typed`: "RTX 4090 Laptop", "V100 DGXS"; "H100
    PCI" and "H100 S" are typos: a lone letter is a mark only where `device_words.LETTERED` names its card). Each
    is another card, with other figures: no name to suggest for it. [] for any other name: a typo, answered with
    the nearest names."""
    said = words(name)
    if not said:
        return []
    model, rest, models = said[0], said[1:], hardware.model_words()
    glued = GLUED_FORM.fullmatch(model)  # ("h100nvl": the model, then its form)
    if glued and glued[1] in models:
        model, rest = glued[1], [glued[2], *rest]
    marked, found = model in OTHER_MODELS, models.get(OTHER_MODELS.get(model, model))
    listed_model = found is not None and not marked
    if found is None:  # a letter glued before or after a listed model, in one word or two: the longest that fits
        for typed, after in ((model, rest), *(((model + rest[0], rest[1:]),) if rest else ())):
            fits = [m for m in models
                    if (g := re.fullmatch(rf"([a-z]*){re.escape(m)}([a-z]*)", typed)) and any(g.groups())]
            if fits:
                found, marked, rest = models[max(fits, key=len)], True, after
                break
    entries = [d for k, d in hardware.DEVICES.items() if k.split("-")[0] == found]
    for word in rest:
        size, form = MEMORY_WORD.fullmatch(word), _FORM.fullmatch(word)
        marked = marked or word in OTHER_WORDS or bool(
            size and all(f"{d.memory_gib:g}" != size[1] for d in entries)) or bool(
            form and not any(word in FORMS.get(d.name, ()) for d in entries)) or (
            listed_model and not size and not form and len(word) > 1 and not _typed(word))
    return entries if marked else []


def _typed(word: str) -> bool:
    """Whether `word`, neither a memory size nor a form factor, is close to one (a typo of it: "pci", "sxn",
    "80gbb") rather than a word of another card ("laptop", "dgxs")."""
    import difflib

    typed = {f for forms in FORMS.values() for f in forms} | {
        f"{d.memory_gib:g}gb" for d in hardware.DEVICES.values()}
    return bool(difflib.get_close_matches(word, sorted(typed), 1, 0.6))


def unknown(name: str) -> str:
    """The one line refusing `--device name`, which `hardware.lookup` finds no entry for: another card of a listed
    model (`family_entries`) said to be one, with what to do; else the nearest listed names (of the model `name`
    starts with when that model is listed: "A100-80GBB" is no A800), then all of them."""
    names = f"{', '.join(listed())} or cpu"
    if kin := [d.name for d in family_entries(name)]:  # "H100 NVL": not an H100 listed
        return (f"--device: {name!r} has no table entry ({' and '.join(kin)} "
                f"{'are other cards' if kin[1:] else 'is another card'}, with other figures); plan it as a listed "
                f"device with no more memory than it has, and its dense peak as --peak_tflops N; listed: {names}")
    import difflib

    models = hardware.model_words()
    known = {**{k: k.upper() for k in hardware.ALIASES if k[0].isalpha()}, **{n.lower(): n for n in listed()}}
    said = words(name)
    if model := models.get(said[0]) if said else None:  # ("4090 PCIe" would be "did you mean H100-PCIe?")
        known = {k: n for k, n in known.items() if models.get(k.split("-")[0]) == model}
    near = [known[k] for k in difflib.get_close_matches(name.lower(), list(known), 3, 0.6)]
    guess = f" (did you mean {', '.join(near[:-1]) + ' or ' if near[1:] else ''}{near[-1]}?)" if near else ""
    return f"--device: unknown device {name!r}{guess}; use one of {names}"
