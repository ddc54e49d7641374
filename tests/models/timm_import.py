"""timm without torchvision, for the reference side of Gemma 3n's vision tower.

timm imports torchvision when it is imported (transforms, FrozenBatchNorm2d, fx feature
extraction), yet MobileNet-V5 runs none of that code; and PyPI's torchvision does not load
beside the CPU torch the tests use. import_timm() answers those imports with stubs for the
duration of `import timm` only, then takes them out of sys.modules again.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types


class _StubMeta(type):
    def __getattr__(cls, name):  # torchvision.transforms.InterpolationMode.BILINEAR and the like
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(f"{cls.__name__}.{name}", (), {})


class _StubModule(types.ModuleType):
    """A torchvision module whose every name is a fresh, distinct class (timm keys dicts by them)."""

    def __init__(self, name: str):
        super().__init__(name)
        self.__path__ = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StubMeta(f"{self.__name__}.{name}", (), {})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision" or fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StubModule(spec.name)

    def exec_module(self, module):
        pass


def import_timm():
    """The timm module, imported with torchvision stubbed; idempotent. ImportError if timm is
    not installed."""
    if "timm" in sys.modules:
        return sys.modules["timm"]
    import importlib.util
    if importlib.util.find_spec("timm") is None:
        raise ImportError("timm is not installed: pip install --no-deps timm==1.0.20")
    finder = _StubFinder()
    sys.meta_path.insert(0, finder)
    try:
        import timm
    finally:
        sys.meta_path.remove(finder)
        for name in [m for m, mod in sys.modules.items() if isinstance(mod, _StubModule)]:
            del sys.modules[name]  # (a real torchvision already imported stays)
    return timm
