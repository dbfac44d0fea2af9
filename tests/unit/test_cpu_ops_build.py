"""How the fused CPU kernels are built: flags per target, a cold build published atomically and reused, a
refusing compiler remembered. Each build runs in its own process with its own cache directory (forked from a process
that has imported Paddle and never loaded the kernels: tests/forkserver.py; the cache directory and the compiler are
read when the kernels are first loaded)."""
import json
import os
import types

from pretrain_cli.ops import cpu_build, cpu_ops


def test_512_bit_vectors_are_asked_for_on_x86_only_and_key_the_library(monkeypatch, tmp_path):
    # GCC keeps Intel AVX-512 loops at 256 bits without it; an ARM compiler would refuse the flag
    assert cpu_build.cxxflags("x86_64") == [*cpu_build.CXXFLAGS, "-mprefer-vector-width=512"]
    assert cpu_build.cxxflags("aarch64") == cpu_build.CXXFLAGS
    stub = types.SimpleNamespace(__file__=str(tmp_path / "paddle" / "__init__.py"), __version__="0.0")
    keys = {}
    for machine in ("x86_64", "aarch64"):
        monkeypatch.setattr(cpu_build.platform, "machine", lambda m=machine: m)
        compiles, _ = cpu_build._commands(stub, tmp_path / "x.so", [tmp_path / f"{s}.o" for s in cpu_build.SOURCES])
        assert len(compiles) == len(cpu_build.SOURCES)
        assert all(("-mprefer-vector-width=512" in c) == (machine == "x86_64") for c in compiles)
        keys[machine] = cpu_build.library_path(stub)
    assert keys["x86_64"] != keys["aarch64"]  # other flags, another library: never a stale build


BUILD_PROBE = r"""
import json, os
from pretrain_cli import runtime
paddle = runtime.import_paddle()
from pretrain_cli.ops import cpu_build, cpu_ops
ops = cpu_ops.load()
print(json.dumps({"ok": ops is not None, "error": cpu_ops.load_error(),
                  "files": sorted(os.listdir(cpu_build.cache_dir())) if cpu_build.cache_dir().is_dir() else []}))
"""


def _probe(tmp_path, **env):
    import forkserver

    e = dict(os.environ) | {"XDG_CACHE_HOME": str(tmp_path)} | env
    out = forkserver.run(["-c", BUILD_PROBE], env=e, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _replaying_compiler(tmp_path) -> str:
    """A compiler that replays the normal build instead of compiling (the sources' ~40 core-seconds of parsing
    Paddle's headers): each compile writes its object file, the link copies this machine's library, built from
    these sources by `cpu_ops.load()` (tests/unit/test_cpu_ops.py checks that build and the kernels' numerics). The
    test below checks how a cold build is run, published and reused, and that the library it published loads."""
    built = cpu_ops.load()
    assert built is not None, cpu_ops.load_error()
    from pretrain_cli import runtime

    real = cpu_build.library_path(runtime.import_paddle())
    cxx = tmp_path / "cxx-replay"
    cxx.write_text("#!/bin/sh\n"
                   'out=; shared=; prev=\n'
                   'for a in "$@"; do [ "$prev" = -o ] && out=$a; [ "$a" = -shared ] && shared=1; prev=$a; done\n'
                   '[ -n "$out" ] || exec g++ "$@"\n'  # --version: the compiler's identity, part of the key
                   f'if [ -n "$shared" ]; then cp "{real}" "$out"; else echo replayed > "$out"; fi\n')
    cxx.chmod(0o755)
    return str(cxx)


def test_build_from_an_empty_cache_is_atomic_and_reused(tmp_path):
    cxx = _replaying_compiler(tmp_path)
    first = _probe(tmp_path, CXX=cxx)
    assert first["ok"], first["error"]
    libs = [f for f in first["files"] if f.endswith(".so")]
    assert len(libs) == 1 and not [f for f in first["files"] if ".tmp" in f]  # no half-written library
    lib = tmp_path / "pretrain-cli" / libs[0]
    mtime = lib.stat().st_mtime_ns
    assert _probe(tmp_path, CXX=cxx)["ok"] and lib.stat().st_mtime_ns == mtime  # second process reuses it
    broken = _probe(tmp_path / "other", CXX="/nonexistent/g++")
    assert not broken["ok"] and "nonexistent" in broken["error"]


def test_a_refusing_compiler_is_remembered_and_stale_temporaries_are_swept(tmp_path):
    cxx = tmp_path / "cxx"
    cxx.write_text("#!/bin/sh\necho 'csrc/loss.cc:1: error: no such header' >&2\nexit 1\n")
    cxx.chmod(0o755)
    cache = tmp_path / "cache" / "pretrain-cli"
    cache.mkdir(parents=True)
    stale = cache / "cpu_ops-0123456789abcdef.loss.tmp999.o"  # a killed build's leftover
    stale.write_bytes(b"x")
    first = _probe(tmp_path / "cache", CXX=str(cxx))
    assert not first["ok"] and "compiler failed: csrc/loss.cc:1: error: no such header" in first["error"]
    assert not stale.exists()
    assert [f for f in first["files"] if f.endswith(".failed")]  # remembered for this key...
    again = _probe(tmp_path / "cache", CXX=str(cxx))
    assert not again["ok"] and "delete it to retry" in again["error"]  # ...so the next process does not rebuild


def test_the_build_line_promises_the_time_this_machine_needs():
    """20 s on 2 idle cores (README.md); a load of 2 on 2 cores doubles it (the 41 s measured): the line says so."""
    from pretrain_cli.ops.cpu_build import build_seconds

    assert build_seconds(2, 0.0) == 20.0 and build_seconds(2, 2.0) == 40.0
    assert build_seconds(8, 0.0) < build_seconds(2, 0.0) < build_seconds(2, 19.0)
