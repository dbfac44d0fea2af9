"""Import a script of benchmarks/ as a module, so tests call its pure functions without running it."""
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str):
    """benchmarks/<name>.py as a module. benchmarks/ goes on sys.path and stays there, as when a script runs: the
    scripts import their siblings (step_timing, gemm_paths) at the top and some inside functions (step_floor,
    cli_throughput), which a test may call later."""
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
