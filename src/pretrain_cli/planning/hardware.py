"""Known accelerators: dense peak TFLOPS and memory, shared by the trainer's MFU and the planner; this machine's
CPU peak, memory and disk, which `plan --device cpu` plans for and the trainer's CPU MFU reads.

Versioned table (peaks are the vendor's dense, non-sparse figures). MFU against a wrong peak is
the most common silent error in the field (torchtitan #668: TF32 peak, 2x off; nanoGPT #464:
A100 peak on H100, 104 % MFU), so an unknown device gets no MFU rather than a guess.
"""
from __future__ import annotations

import functools
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from pretrain_cli.planning import device_words

TABLE_VERSION = "2026-11"


@dataclass(frozen=True)
class Device:
    name: str
    memory_gib: float
    bf16_tflops: float | None  # dense bf16/fp16 tensor-core peak
    fp32_tflops: float | None  # non-tensor-core fp32 peak (what a plain fp32 run can reach)
    fp16_tflops: float | None = None  # when different from bf16 (V100, T4 have no bf16)
    nvlink_gbps: float | None = None  # NVLink per GPU as the vendor quotes it (both directions); None: PCIe only
    pcie_gen: int = 4  # the host link, x16, where there is no NVLink
    capability: tuple[int, int] | None = None  # CUDA compute capability (`CAPABILITY`)


GPUS_PER_NODE = 8  # an HGX/DGX node, the launcher's `--devices 0,...,7` on every node; `plan --gpus_per_node`
# The cross-node link per GPU one way that `plan` assumes, by the GPU's generation (compute capability's major):
# NVIDIA's 8-GPU node of it has one InfiniBand adapter per GPU: DGX H100/H800/H20 8 x 400 Gb/s NDR (50 GB/s), DGX
# A100/A800 8 x 200 Gb/s HDR (25), DGX-2 V100 8 x 100 Gb/s EDR (12.5). A PCIe card takes its generation's (H100-PCIe
# 50); Turing (T4) and Ada (L4, L40S, RTX4090) have no DGX of their own: Volta's and Ampere's. Only right for a fabric
# like that one: `plan --cross_node_gbps` gives a cluster's own (RoCE, fewer adapters), and the ETA line says so.
CROSS_NODE_GBPS = {7: 12.5, 8: 25.0, 9: 50.0}
PCIE_GBPS = {3: 15.75, 4: 31.5, 5: 63.0}  # x16, one direction (GB/s)
CPU_LINK_GBPS = 50.0  # `--device cpu`: gloo between processes, no table figure; ranks layouts, not a measurement

# CUDA compute capability per table entry (NVIDIA's CUDA GPUs list): what `plan --device NAME` assumes; a run on a
# GPU asks the driver instead (`runtime.gpu_capability`), so a card missing from the table is judged too
CAPABILITY = {"V100-16GB": (7, 0), "V100-32GB": (7, 0), "T4": (7, 5), "A10": (8, 6), "A100-40GB": (8, 0),
              "A100-80GB": (8, 0), "A800-80GB": (8, 0), "L4": (8, 9), "L40S": (8, 9), "RTX3090": (8, 6),
              "RTX4090": (8, 9), "H100-SXM": (9, 0), "H100-PCIe": (9, 0), "H800": (9, 0), "H20": (9, 0),
              "H200": (9, 0)}

DEVICES = {
    d.name.lower(): replace(d, capability=CAPABILITY[d.name])
    for d in (
        Device("V100-16GB", 16, None, 15.7, 125.0, 300.0, 3),
        Device("V100-32GB", 32, None, 15.7, 125.0, 300.0, 3),
        Device("T4", 16, None, 8.1, 65.0, None, 3),
        Device("A10", 24, 125.0, 31.2),
        Device("A100-40GB", 40, 312.0, 19.5, None, 600.0),
        Device("A100-80GB", 80, 312.0, 19.5, None, 600.0),
        Device("A800-80GB", 80, 312.0, 19.5, None, 400.0),
        Device("L4", 24, 121.0, 30.3),
        Device("L40S", 48, 362.0, 91.6),
        Device("RTX3090", 24, 71.0, 35.6),
        Device("RTX4090", 24, 165.2, 82.6),
        Device("H100-SXM", 80, 989.0, 67.0, None, 900.0, 5),
        Device("H100-PCIe", 80, 756.0, 51.0, None, None, 5),
        Device("H800", 80, 989.0, 67.0, None, 400.0, 5),
        Device("H20", 96, 148.0, 44.0, None, 900.0, 5),
        Device("H200", 141, 989.0, 67.0, None, 900.0, 5),
    )
}
ALIASES = {"a100": "a100-80gb", "h100": "h100-sxm", "v100": "v100-32gb", "a800": "a800-80gb",
           "16gb": "v100-16gb", "3090": "rtx3090", "4090": "rtx4090"}


def model_words() -> dict[str, str]:
    """{a model word a name may start with: the table's model it names}: the entries' first words and the aliases
    of a model ("4090": rtx4090; not "16gb", a size). `lookup` (through `device_words.read`) and
    `device_names` read a name's model through it."""
    first = {k.split("-")[0]: k.split("-")[0] for k in DEVICES}
    return first | {a: k.split("-")[0] for a, k in ALIASES.items() if not a.endswith("gb")}


def lookup(name: str) -> Device | None:
    """The table entry of a user-given or driver-reported name ("NVIDIA A100-SXM4-80GB"), or None. A driver name is
    matched word by word: its model (an entry's first word: "L40" is not "L4", "GH200" not "H200"), then each other
    word a memory size the entry has ("80GB", typed also "80 GB", "80G" or "80") or a form factor it covers
    (`device_words.FORMS`, typed also glued to the model: "h100sxm"; the model also as its alias: "4090 PCIe").
    Without a memory size, the model's `ALIASES` entry where it has several. A PCIe card of an entry with NVLink is
    that entry without it (`device_words.FORMS`' comment). The name's words are `device_words.read`'s."""
    key = name.lower().replace("nvidia", "").replace("tesla", "").strip().replace(" ", "-")
    if key in DEVICES:
        return DEVICES[key]
    if key in ALIASES:
        return DEVICES[ALIASES[key]]
    read = device_words.read(name, model_words())
    if read is None:
        return None
    model, rest = read
    options = [d for k, d in DEVICES.items() if k.split("-")[0] == model]
    for word in rest:
        size = device_words.MEMORY_WORD.fullmatch(word)
        options = [d for d in options
                   if (f"{d.memory_gib:g}" == size[1] if size else word in device_words.FORMS.get(d.name, ()))]
    if len(options) > 1:
        default = DEVICES.get(ALIASES.get(model, ""))
        options = [default] if default in options else []
    if not options:
        return None
    if "pcie" in rest and options[0].nvlink_gbps:
        return replace(options[0], name=f"{options[0].name}-PCIe", nvlink_gbps=None)
    return options[0]


@dataclass(frozen=True)
class Node:
    """What `plan` assumes of a node: its GPUs (consecutive ranks share one) and the cross-node link per GPU
    (`--gpus_per_node`, `--cross_node_gbps`; None: the device's generation's, `CROSS_NODE_GBPS`)."""

    gpus: int = GPUS_PER_NODE
    cross_node_gbps: float | None = None


@dataclass(frozen=True)
class Links:
    """The two links a group of ranks uses (GB/s one way per GPU): `in_node` between the GPUs of one node of
    `gpus_per_node`, `cross_node` when a group spans nodes; `source` says where the in-node figure came from,
    `cross_node_source` the cross-node one (an assumption unless --cross_node_gbps gave it)."""

    gpus_per_node: int
    in_node_gbps: float
    cross_node_gbps: float
    source: str
    cross_node_source: str = ""


def links(device: Device | None, node: Node = Node()) -> Links:
    """The in-node link of `device`: half its bidirectional NVLink figure (the speed model counts the bytes one GPU
    sends, and a ring collective sends and receives at once; a ceiling, as the peak is for compute), else its PCIe
    x16 one way; the cross-node link `node`'s, else the device's generation's (`CROSS_NODE_GBPS`). `device` None
    (`--device cpu`): CPU_LINK_GBPS for both."""
    gpus_per_node = node.gpus
    if device is None:
        return Links(gpus_per_node, CPU_LINK_GBPS, CPU_LINK_GBPS, "cpu: no link table, a placeholder figure",
                     "cpu: a placeholder figure")
    if node.cross_node_gbps is not None:
        cross, said = node.cross_node_gbps, "--cross_node_gbps"
    else:
        cross = cross_node_gbps((device.capability or (9, 0))[0])
        said = f"assumed for {device.name}'s generation of nodes, one InfiniBand adapter a GPU: --cross_node_gbps"
    if device.nvlink_gbps:
        return Links(gpus_per_node, device.nvlink_gbps / 2, cross,
                     f"{device.name} NVLink {device.nvlink_gbps:g} GB/s both directions, one way", said)
    return Links(gpus_per_node, PCIE_GBPS[device.pcie_gen], cross,
                 f"{device.name} PCIe {device.pcie_gen}.0 x16, one way", said)


def cross_node_gbps(major: int) -> float:
    """`CROSS_NODE_GBPS` of a compute capability's major; one the table does not hold takes the nearest generation's
    (a newer GPU the newest figure, an older one the oldest): a device added to the table, or a driver reporting a
    newer capability, is planned, not refused."""
    known = sorted(CROSS_NODE_GBPS)
    return CROSS_NODE_GBPS.get(major, CROSS_NODE_GBPS[known[-1] if major > known[-1] else known[0]])


def capability(name: str | None, reported: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """The GPU's compute capability: the driver's (`reported`, `paddle.device.cuda.get_device_capability()`: `train`,
    `check`, `eval` on a GPU) when there is one, else the table's for `name` (`plan --device`), else None."""
    if reported is not None:
        return tuple(reported)
    entry = lookup(name) if name else None
    return entry.capability if entry is not None else None


def pre_ampere(cap: tuple[int, int] | None) -> bool:
    """The one capability rule `plan` and `train` share (`cap`: `capability(...)`): below compute capability 8.0 a
    GPU has no bf16 (Paddle's AMP turns bf16 off there: `_is_gpu_bfloat16_supported`, amp/auto_cast.py 3.3.1) and
    no flash attention (`F.scaled_dot_product_attention` wants SM 8.0..12.1: nn/functional/sdpa.py 3.3.1): V100
    (7.0), T4 (7.5). False when the capability is unknown."""
    return cap is not None and tuple(cap) < (8, 0)


def no_bf16(name: str | None, cap: tuple[int, int] | None) -> str | None:
    """Why a GPU (`name`, capability `cap`) cannot run bf16, as `config.resolve` words it; None when it can (or
    the capability is unknown). Paddle's AMP turns bf16 off below 8.0 with a warning only (amp/auto_cast.py 3.3.1,
    `_is_gpu_bfloat16_supported`), so such a run would be fp32 while the file says bf16."""
    if not pre_ampere(cap):
        return None
    return (f"{name or 'this GPU'} has no bf16 tensor cores (compute capability {cap[0]}.{cap[1]}; bf16 came with "
            f"Ampere, 8.0: A10, A100, L4, H100)")


def resolve_peak(device: Device | None, name: str, amp_dtype: str | None,
                 given: tuple[float | None, str] | None = None, processes: int = 1) -> tuple[float | None, str]:
    """(peak TFLOPS per device, where it came from): a peak the user gave (`given`: value, its source), else
    the table's dense peak for `amp_dtype` (fp16/bf16 under AMP, non-tensor-core fp32 otherwise), else for `name`
    "cpu" the cores' assumed fp32 peak of each of `processes` processes sharing this machine (`cpu_peak_tflops`,
    the peak `train` logs its CPU MFU against), else None with the reason. What `plan`'s ETA and the trainer's
    MFU both use; `name` is what was looked up."""
    if given is not None:
        return given
    if device is None and name == "cpu":
        return cpu_peak_tflops(processes=processes)
    if device is None:
        return None, f"{name} has no table entry"
    value = peak_tflops(device, amp_dtype)
    kind = {"float16": "fp16", "bfloat16": "bf16"}.get(amp_dtype, "fp32 (non-tensor-core)")
    if value is None:
        return None, f"{device.name} has no {kind} peak in pretrain_cli.planning.hardware"
    return value, f"pretrain_cli.planning.hardware table {TABLE_VERSION}: {device.name} dense {kind}"


ASSUMED_PEAK = "an assumed fp32 peak"  # how `cpu_peak_tflops`'s source starts: the report tells it from a peak given
NO_MFU = "no MFU (set peak_tflops to report one)"  # how a reason for no peak ends in `train`'s log

# fp32 FLOPs per cycle per core at the widest vector FMA the core announces, with two FMA units (the most any
# x86 core has): an upper bound, never an estimate that a fast run could pass.
_FLOPS_PER_CYCLE = (("avx512f", 64), ("fma", 32), ("avx", 16), ("sse2", 8), ("asimd", 16))


def cpu_peak_tflops(cpuinfo: str | None = None, cores: int | None = None, max_khz: list[int] | None = None,
                    processes: int = 1) -> tuple[float | None, str]:
    """(theoretical fp32 peak of the cores one process computes with, how it was reckoned), or (None, why).

    A matmul timed at start-up is no peak: on a shared machine it ranged 15.7-214.8 GFLOP/s across runs and
    training then ran faster than it, logging mfu above 1. The bound here is the same in every run on one
    machine: cores (the process's threads, at most its share of the cores it may use when `processes` share
    them: `plan --device cpu --gpus N`) x the highest clock the kernel reports (cpuinfo_max_freq, else `cpu MHz`)
    x FLOPs per cycle from the vector flags. `cpuinfo` and `max_khz` default to this host's, read once per process
    (`_host_cpuinfo`, `_host_max_khz`)."""
    from pretrain_cli.runtime import decide_threads, default_threads

    cpuinfo = _host_cpuinfo() if cpuinfo is None else cpuinfo
    max_khz = _host_max_khz() if max_khz is None else max_khz
    mhz = [float(line.split(":", 1)[1]) for line in cpuinfo.splitlines()
           if line.startswith("cpu MHz") and ":" in line and line.split(":", 1)[1].strip()]
    ghz = max([k / 1e6 for k in max_khz] + [m / 1e3 for m in mhz], default=0.0)
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith(("flags", "Features")) and ":" in line:
            flags = set(line.split(":", 1)[1].split())
            break
    flag, per_cycle = next(((f, n) for f, n in _FLOPS_PER_CYCLE if f in flags), (None, None))
    if cores is None:
        cores = min(decide_threads()[0], default_threads(processes))
    if not ghz or per_cycle is None:
        return None, f"this CPU reports no clock or vector flags: {NO_MFU}"
    peak = cores * ghz * per_cycle / 1e3
    return peak, (f"{ASSUMED_PEAK} of {peak * 1e3:.1f} GFLOP/s = {cores} core(s) x {ghz:.2f} GHz x "
                  f"{per_cycle} FLOP/cycle ({flag}, two FMA units; an upper bound, set peak_tflops to use another)")


@functools.cache
def _host_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" when unreadable), read once per process: `plan --fit` reckons the CPU peak for
    every candidate layout, and the host's clock and flags are facts of the machine, not of the candidate."""
    try:
        return Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


@functools.cache
def _host_max_khz() -> tuple[int, ...]:
    """Each core's highest clock (kHz) as cpufreq reports it (sysfs cpuinfo_max_freq; none without cpufreq), read
    once per process like `_host_cpuinfo`."""
    max_khz = []
    for f in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            max_khz.append(int(f.read_text().strip()))
        except (OSError, ValueError):
            pass
    return tuple(max_khz)


def peak_tflops(device: Device, amp_dtype: str | None) -> float | None:
    if amp_dtype == "float16":
        return device.fp16_tflops or device.bf16_tflops
    if amp_dtype == "bfloat16":
        return device.bf16_tflops
    return device.fp32_tflops


def host_memory_problem(cfg, bytes_per_param: int, doing: str) -> str | None:
    """One line when `cfg`'s parameters alone, `bytes_per_param` each, exceed this machine's memory: a CPU run of a
    model that large grows until the kernel's OOM killer ends it (SIGKILL: no error of ours can be printed then),
    so it is refused before anything is allocated. None when it may fit or the memory is unknown."""
    from pretrain_cli.models.flops import param_counts

    counts = param_counts(cfg)
    params = counts["total"] + counts.get("mtp", 0)
    need, have = params * bytes_per_param / 2**30, cpu_memory_gib()
    if not need > have:  # (NaN: unknown)
        return None
    return (f"model_name_or_path: {doing} {cfg.model_type} with {params / 1e9:.2f} B parameters on this CPU needs at "
            f"least {need:.0f} GiB ({bytes_per_param} bytes a parameter) and this machine has {have:.1f} GiB; "
            f"choose a smaller model (`pretrain-cli plan FILE --device cpu` shows the whole breakdown)")


def training_memory_problem(run, cfg) -> str | None:
    """`host_memory_problem` for a one-process CPU training run (fp32 weights, gradients and AdamW's two moments:
    16 bytes a parameter before any activation); None for any other run."""
    if run.device != "cpu" or run.parallel.world_size != 1 or not run.loop.do_train:
        return None
    return host_memory_problem(cfg, 16, "training")


def host_available_gib(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> tuple[float, str]:
    """(GiB a new run on this machine may still take, where the figure comes from): /proc/meminfo's MemAvailable
    (what the kernel can hand out without swapping), lowered to the room under this container's cgroup limit when
    one is set (v2 `memory.max` less `memory.current`, its inactive page cache added back; v1's
    `memory/memory.limit_in_bytes` the same way): the limit is what the out-of-memory killer enforces, whatever the
    machine has free. NaN when neither can be read. Read again at each call: other work changes it."""
    try:
        with open(meminfo, encoding="ascii") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        have, source = kib / 2**20, "MemAvailable"
    except (OSError, StopIteration, ValueError, IndexError):
        have, source = float("nan"), ""
    room = _cgroup_room(cgroup)
    if room is not None and not room[0] >= have:  # (a NaN `have`: the cgroup's figure alone)
        have, source = room
    return have, source or "unknown"


def _cgroup_room(root: str) -> tuple[float, str] | None:
    """(GiB left under the cgroup's memory limit, its description), or None without a limit."""
    for limit, current, inactive, stat in (("memory.max", "memory.current", "inactive_file", "memory.stat"),
                                           ("memory/memory.limit_in_bytes", "memory/memory.usage_in_bytes",
                                            "total_inactive_file", "memory/memory.stat")):
        try:
            with open(f"{root}/{limit}", encoding="ascii") as f:
                text = f.read().strip()
            if text == "max" or int(text) >= 2**60:  # v2's "max", v1's page-rounded 2^63: no limit
                return None
            with open(f"{root}/{current}", encoding="ascii") as f:
                used = int(f.read().strip())
            cached = 0
            try:
                with open(f"{root}/{stat}", encoding="ascii") as f:
                    cached = next((int(v) for k, v in (line.split() for line in f) if k == inactive), 0)
            except (OSError, ValueError):
                pass
        except (OSError, ValueError):
            continue
        room = max(int(text) - used + cached, 0) / 2**30
        return room, f"the cgroup limit {int(text) / 2**30:.1f} GiB ({root}/{limit}), {room:.1f} GiB of it free"
    return None


def cpu_memory_gib() -> float:
    """This machine's memory (GiB) from /proc/meminfo, the device `plan --device cpu` plans for; NaN when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return float("nan")
    return kib / 2**20


def disk_free_gib(path: str) -> tuple[float, str]:
    """(GiB free on the filesystem that will hold `path`, that filesystem's directory as found): `path`'s nearest
    existing directory, as an output_dir not yet made will be created under it. NaN when none can be read."""
    where = Path(path).absolute()
    while not where.is_dir() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free / 2**30, str(where)
    except OSError:
        return float("nan"), str(where)
