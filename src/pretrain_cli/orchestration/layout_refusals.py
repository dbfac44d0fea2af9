"""The parallel-layout rules' verdicts a search remembers (`config.parallel.resolve_parallel`, which `config.resolve`
runs first for a candidate and which refuses most of `--fit`'s candidates: products of degrees such as sequence
parallelism with a Mixture-of-Experts model or ZeRO-3 under a pipeline, each tried at every micro-batch, recompute
and attention, which the rules do not read). Keyed by what the rules read: the argument values one run of them read
(recorded through `_Reading`) and the world (the device is the search's); a candidate with the same values takes the same path through the
rules, so its verdict is the remembered one, and a refused candidate is not resolved again. A run that read
anything but a section's values (`Arguments.explicit`, `get`) is not remembered. No Paddle.
"""
from __future__ import annotations

from dataclasses import replace

from pretrain_cli.config.keys import KEYS, coerce
from pretrain_cli.config.parallel import resolve_parallel
from pretrain_cli.errors import Problems, UserError

SECTIONS = ("model", "data", "training")


class _Section:
    """One section of `Arguments` (`model`, `data`, `training`) that records each value read from it, in order."""

    __slots__ = ("_section", "_name", "_reads")

    def __init__(self, section, name: str, reads: dict):
        self._section, self._name, self._reads = section, name, reads

    def __getattr__(self, key: str):
        value = getattr(self._section, key)
        self._reads.setdefault((self._name, key), value)  # (the first read: a dict keeps the order)
        return value


class _Reading:
    """`Arguments` as the rules see it: its sections record what they read, anything else read makes the verdict
    not to be remembered (`opaque`)."""

    def __init__(self, args):
        self._args, self.reads, self.opaque = args, {}, False

    def __getattr__(self, name: str):
        value = getattr(self._args, name)
        if name in SECTIONS:
            return _Section(value, name, self.reads)
        self.opaque = True
        return value


class LayoutRefusals:
    """The verdicts of the parallel-layout rules on `args` (the parsed file) with a candidate's `change`, on
    `target` at a candidate's world (of `model_cfg`, the one model a search plans). `remembered(change, world)`: the
    verdict (refused: True) where the rules would read values they read before, else None; `probe(changed, world)`:
    the rules run on the changed arguments, their verdict remembered. Remembered as the rules read: a tree per world
    whose nodes are the keys in the order the rules read them and whose branches are their values (the next key read
    depends only on the values read before it), so a lookup reads what the rules would, from `change` over `args`,
    without copying the arguments or running the rules."""

    def __init__(self, args, model_cfg, target):
        self.args, self.model_cfg, self.target = args, model_cfg, target
        self.trees: dict[int, list] = {}  # world -> [(section, key), {value: subtree}] or a verdict (bool)
        self._file: dict[tuple, str] = {}  # (section, key) -> the file's value, as the rules read it (its repr)
        self._changed: dict[tuple, str] = {}  # (key, a change's value) -> the value typed as `with_changes` types it

    def _value(self, change: dict, section: str, key: str) -> str:
        if key not in change:
            if (section, key) not in self._file:
                self._file[section, key] = repr(getattr(getattr(self.args, section), key))
            return self._file[section, key]
        if (key, change[key]) not in self._changed:
            self._changed[key, change[key]] = repr(coerce(KEYS[key], change[key], "command line"))
        return self._changed[key, change[key]]

    def remembered(self, change: dict, world: int) -> bool | None:
        node = self.trees.get(world)
        try:
            while isinstance(node, list):
                node = node[1].get(self._value(change, *node[0]))
        except TypeError:  # a change's value that is not hashable (a list): not looked up
            return None
        return node

    def probe(self, changed, world: int) -> bool:
        reading, problems = _Reading(changed), Problems()
        try:
            resolve_parallel(reading, self.model_cfg, replace(self.target, world_size=world), [], problems)
        except UserError:
            problems.add("refused")
        refused = bool(problems.items)
        if not reading.opaque:
            self._remember(world, list(reading.reads.items()), refused)
        return refused

    def _remember(self, world: int, reads: list, refused: bool) -> None:
        if not reads:
            return
        holder, slot = self.trees, world
        for (section_key, value) in reads:
            node = holder.get(slot)
            if node is None:
                node = holder[slot] = [section_key, {}]
            elif not isinstance(node, list) or node[0] != section_key:  # (deterministic rules never get here)
                return
            holder, slot = node[1], repr(value)
        holder[slot] = refused
