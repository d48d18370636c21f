"""The Iris layer's program hook (``gemmar.programs.hooks``): on every rank, ``import iris`` gives an Iris.

Which one (:func:`choose`, from ``gemmar run --iris PATH`` / ``--replace_iris`` or ``run_script(iris=,
replace_iris=)``): a real Iris checkout hosted over the rank's heap (``real_iris.py``), else an installed Iris,
else gemmar's stand-in (this folder: Iris's package layout below, each module standing in for Iris's own).
Registered in pyproject.toml (``[project.entry-points."gemmar.program_hooks"]``); the kit never imports it.
"""

import importlib
import sys
import types

from ..errors import UsageError
from . import real_iris   # (light: the CLI builds `gemmar run --help` from these options without torch)


# Iris's package layout -> gemmar's modules (``gemmar.iris.<name>``); the AMD-only ones are refused on use.
PACKAGE_LAYOUT = {"iris": "host", "iris.device": "device", "iris.device.utils": "device",
                  "iris.device.triton": "device",
                  "iris.mem": "device", "iris.mem.utils": "device", "iris.mem.triton": "device", "iris.hip": "hip",
                  "iris.ccl": "ccl", "iris.ops": "ops", "iris.host": "host", "iris.host.tracing": "tracing",
                  "iris.host.logging": "log_format", "iris.host.logging.logging": "log_format",
                  "iris.mem.triton.context": "device", "iris.device.triton.context": "device",
                  "iris.tensor_creation": "tensors", "iris.ops.config": "ops",
                  "iris.ops.matmul_reduce_scatter": "ops", "iris.ops.matmul_all_reduce": "ops",
                  "iris.ops.all_gather_matmul_hbm_buffer": "ops",
                  "iris.host.tracing.events": "tracing"}
AMD_ONLY_MODULES = {"iris.gluon": "Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)",
                    "iris.experimental": "Iris's experimental (Gluon) kernels",
                    "iris.device.gluon": "Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)",
                    "iris.mem.gluon": "Gluon kernels (Triton's gluon dialect, as Iris uses it on ROCm)"}


def _amd_only_module(name, what):
    module = types.ModuleType(name)

    def refuse(attribute):
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise UsageError(f"{name}.{attribute}: {what} are AMD-only; gemmar's iris runs Triton kernels")

    module.__getattr__ = refuse
    return module


def _install_package():
    modules = {name: importlib.import_module(f"{__package__}.{target}") for name, target in PACKAGE_LAYOUT.items()}
    modules.update({name: _amd_only_module(name, what) for name, what in AMD_ONLY_MODULES.items()})
    for name in sorted(modules, key=lambda n: n.count(".")):   # parents first
        sys.modules[name] = modules[name]
        if "." in name:
            parent, _, child = name.rpartition(".")
            # (never over a name the parent module has: iris.host.logging must not hide host.py's `logging`)
            if not hasattr(modules[parent], child):
                setattr(modules[parent], child, modules[name])


class IrisHook:
    options = {"iris": (None, "PATH", "run the real Iris package of this checkout (its own kernels, on gemmar's ranks "
                                      "and heaps); default: an installed Iris if there is one, else gemmar's stand-in"),
               "replace_iris": (False, None, "use gemmar's iris stand-in even where a real Iris is installed")}

    @staticmethod
    def choose(iris=None, replace_iris=False):
        return real_iris.choose(iris, replace_iris)

    @staticmethod
    def describe(choice):
        return real_iris.describe(choice)

    @staticmethod
    def prepare_rank(choice):
        """Make ``import iris`` give the chosen Iris on this rank: ``"gemmar"`` for gemmar's stand-in package,
        or the folder of a real Iris package that runs over this rank's heap."""
        from ..runtime import rank as rank_runtime
        from . import this_rank

        this_rank.heap = rank_runtime.local_ranks()[0].heap
        if choice == real_iris.STAND_IN:
            real_iris.forget_iris_modules()
            _install_package()
        else:
            real_iris.host(choice)


HOOK = IrisHook()
