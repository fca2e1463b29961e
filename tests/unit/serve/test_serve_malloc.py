"""The allocator switch of the CPU server's launch environment (``SPECDEPLOY_TRITON_MALLOC``,
pipeline/serve/command.py): the exact ``LD_PRELOAD`` each choice produces, against allocator
libraries laid out in a temporary directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ServeError
from pipeline.serve import command
from pipeline.serve.command import MALLOC_ENV, CpuServer, cpu_server_env, malloc_env, malloc_in_env

SERVER = CpuServer(Path("/w/bin/tritonserver"), Path("/w/backends"), ())


def _install(lib_dir: Path, *names: str) -> dict[str, Path]:
    lib_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: lib_dir / command.MALLOC_LIBRARIES[name] for name in names}
    for path in paths.values():
        path.write_bytes(b"\x7fELF")
    return paths


@pytest.fixture
def libs(tmp_path, monkeypatch):
    """Both allocators installed in one directory, the only one searched."""
    lib_dir = tmp_path / "lib"
    monkeypatch.setattr(command, "LIBRARY_DIRS", (tmp_path / "empty", lib_dir))
    return _install(lib_dir, "jemalloc", "tcmalloc")


def test_launch_env_preloads_the_named_allocator(libs):
    env = cpu_server_env(SERVER, {"PATH": "/usr/bin", MALLOC_ENV: "jemalloc"})
    assert env["LD_PRELOAD"] == str(libs["jemalloc"])
    assert malloc_in_env(env) == "jemalloc"
    env = cpu_server_env(SERVER, {"PATH": "/usr/bin", MALLOC_ENV: "tcmalloc", "LD_PRELOAD": "/opt/a.so"})
    assert env["LD_PRELOAD"] == f"{libs['tcmalloc']}:/opt/a.so"  # first, the caller's preloads kept
    assert malloc_in_env(env) == "tcmalloc"


def test_default_and_glibc_preload_nothing(libs):
    assert command.DEFAULT_MALLOC == "glibc"
    for base in ({"PATH": "/usr/bin"}, {"PATH": "/usr/bin", MALLOC_ENV: "glibc"}):
        env = cpu_server_env(SERVER, base)
        assert "LD_PRELOAD" not in env and malloc_in_env(env) == "glibc"
    env = cpu_server_env(SERVER, {"PATH": "/usr/bin", MALLOC_ENV: "glibc", "LD_PRELOAD": "/opt/a.so"})
    assert env["LD_PRELOAD"] == "/opt/a.so"


def test_auto_takes_the_first_installed_or_glibc(tmp_path):
    lib_dir = tmp_path / "lib"
    assert malloc_env("auto", {}, (lib_dir,)) == {}
    tcmalloc = _install(lib_dir, "tcmalloc")["tcmalloc"]
    assert malloc_env("auto", {}, (lib_dir,)) == {"LD_PRELOAD": str(tcmalloc)}
    jemalloc = _install(lib_dir, "jemalloc")["jemalloc"]
    assert malloc_env("auto", {"LD_PRELOAD": str(jemalloc)}, (lib_dir,)) == {"LD_PRELOAD": str(jemalloc)}


def test_missing_or_unknown_allocator_is_an_error(tmp_path):
    with pytest.raises(ServeError, match=r"libjemalloc\.so\.2 is not installed.*apt-get install libjemalloc2"):
        malloc_env("jemalloc", {}, (tmp_path,))
    with pytest.raises(ServeError, match="expected one of auto, glibc, jemalloc, tcmalloc"):
        cpu_server_env(SERVER, {"PATH": "/usr/bin", MALLOC_ENV: "mimalloc"})
