"""gemmar's lab: what measures the kit and records what it measured, outside the package (issue 59).

Importable as ``lab`` from the repository root (``lab/README.md``): ``from lab.models import allreduce_model``.
The package never imports it.
"""
