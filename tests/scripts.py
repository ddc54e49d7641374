"""The repository's scripts (build passes, bench tools) loaded by path for the tests, leaving
sys.path, sys.modules and sys.dont_write_bytecode as they were: a script that puts its own
folder on sys.path would otherwise let its neighbours shadow installed packages for every later
test (bench/gpu/kernels.py shadowed PyPI's `kernels`, which transformers imports)."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType


def load_script(path: pathlib.Path, *search: pathlib.Path) -> tuple[ModuleType, dict[str, ModuleType]]:
    """(the script at `path` as a module, {name: module} of what it imported from `search`
    folders or its own), with `search` on sys.path only while it loads."""
    folders = [str(p) for p in (path.parent, *search)]
    saved = list(sys.path), set(sys.modules), sys.dont_write_bytecode
    spec = importlib.util.spec_from_file_location(f"metalkv_script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    siblings = {}
    try:
        sys.path[:0] = folders
        spec.loader.exec_module(module)
    finally:
        sys.path[:], sys.dont_write_bytecode = saved[0], saved[2]
        for name in set(sys.modules) - saved[1]:
            where = str(pathlib.Path(getattr(sys.modules[name], "__file__", None) or "/").resolve())
            if any(where.startswith(str(pathlib.Path(f).resolve())) for f in folders):
                siblings[name] = sys.modules.pop(name)
    return module, siblings
