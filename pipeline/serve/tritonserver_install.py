"""Locate the ``tritonserver`` binary, its backends directory and the Python-backend stub.

Reads the installed ``nvidia-pytriton`` wheel's layout (without importing pytriton):
``pytriton/tritonserver/bin/tritonserver``, ``pytriton/tritonserver/backends/`` and one stub per
Python version in ``pytriton/tritonserver/python_backend_stubs/<X.Y>/triton_python_backend_stub``;
the stub for the running Python must end up as ``backends/python/triton_python_backend_stub``
(the serving stage places it; this module only reports). Falls back to a ``tritonserver`` on PATH
(an NGC container: backends in ``/opt/tritonserver/backends``). ``SPECDEPLOY_TRITONSERVER`` may
name the binary explicitly. Writes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import SpecdeployError, UsageError

STUB_NAME = "triton_python_backend_stub"
ENV_OVERRIDE = "SPECDEPLOY_TRITONSERVER"


@dataclass(frozen=True)
class TritonInstall:
    binary: Path  # the tritonserver executable
    backend_dir: Path  # --backend-directory
    stub_path: Path | None  # the stub built for this Python (None if none fits)
    source: str  # "pytriton", "PATH" or "env"
    library_dirs: tuple[Path, ...] = field(default=())  # extra LD_LIBRARY_PATH entries
    python_version: str = f"{sys.version_info.major}.{sys.version_info.minor}"

    @property
    def placed_stub(self) -> Path:
        """Where tritonserver's Python backend looks for the stub."""
        return self.backend_dir / "python" / STUB_NAME

    @property
    def stub_in_place(self) -> bool:
        return self.placed_stub.is_file()

    @property
    def placed_stub_matches(self) -> bool:
        """True when the placed stub is the one built for this Python (byte-identical)."""
        if self.stub_path is None or not self.placed_stub.is_file():
            return False
        if self.placed_stub.resolve() == self.stub_path.resolve():
            return True
        try:
            return self.placed_stub.read_bytes() == self.stub_path.read_bytes()
        except OSError:
            return False

    @property
    def available_stub_versions(self) -> list[str]:
        stubs = self.binary.parent.parent / "python_backend_stubs"
        if not stubs.is_dir():
            return []
        return sorted((p.name for p in stubs.iterdir() if (p / STUB_NAME).is_file()),
                      key=lambda v: tuple(int(x) for x in v.split(".") if x.isdigit()))


def _python_version() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _pytriton_root() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _interpreter_libdir(python_version: str) -> tuple[Path, ...]:
    """The running interpreter's own libpython directory (shared builds, same X.Y as the stub).
    The wheel's stub links ``libpython3.X.so.1.0`` by name; found in the system directory, a
    different patch release can lack symbols this interpreter's C extensions need (``_ssl``:
    ``_PyModule_Add``), so the stub must load the libpython the venv's stdlib was built with."""
    import sysconfig  # noqa: PLC0415 - only this path needs it

    libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
    if python_version != _python_version() or not libdir or not soname or not (Path(libdir) / soname).is_file():
        return ()
    return (Path(libdir),)


def from_pytriton(package_dir: Path, python_version: str | None = None) -> TritonInstall | None:
    """The install inside a pytriton package directory, or None when it has no binary."""
    server_dir = package_dir / "tritonserver"
    binary = server_dir / "bin" / "tritonserver"
    if not binary.is_file():
        return None
    version = python_version or _python_version()
    stub = server_dir / "python_backend_stubs" / version / STUB_NAME
    libs = package_dir.parent / "nvidia_pytriton.libs"
    return TritonInstall(
        binary=binary,
        backend_dir=server_dir / "backends",
        stub_path=stub if stub.is_file() else None,
        source="pytriton",
        library_dirs=_interpreter_libdir(version)
        + tuple(p for p in (libs, server_dir / "external_libs") if p.is_dir()),
        python_version=version,
    )


def _from_binary(binary: Path, source: str) -> TritonInstall:
    backend_dir = binary.resolve().parent.parent / "backends"
    stub = backend_dir / "python" / STUB_NAME
    return TritonInstall(binary=binary, backend_dir=backend_dir, stub_path=stub if stub.is_file() else None,
                         source=source, python_version=_python_version())


def find_tritonserver() -> TritonInstall:
    """The tritonserver to use: $SPECDEPLOY_TRITONSERVER, the pytriton wheel's, or one on PATH."""
    override = os.environ.get(ENV_OVERRIDE)
    if override:
        binary = Path(override)
        if not binary.is_file():
            raise UsageError(f"{ENV_OVERRIDE}={override} is not a file")
        return _from_binary(binary, "env")
    root = _pytriton_root()
    if root is not None:
        install = from_pytriton(root)
        if install is not None:
            return install
    on_path = shutil.which("tritonserver")
    if on_path:
        return _from_binary(Path(on_path), "PATH")
    raise SpecdeployError(
        "no tritonserver found: install the CPU extras (pip install 'nvidia-pytriton==0.7.0', "
        "i.e. pip install -e '.[cpu]'), put tritonserver on PATH, or set SPECDEPLOY_TRITONSERVER"
    )
