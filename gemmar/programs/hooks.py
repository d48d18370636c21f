"""The kit's one hook for the layers above it: what a layer sets up on each rank before a program runs there.

The kit runs any program on its ranks (``gemmar run``, ``Cluster.run_script``, ``Cluster.activate``) and knows no
layer by name. A layer (gemmar's Iris layer is one: ``import iris`` on every rank) registers a hook under the
entry-point group ``gemmar.program_hooks`` of its distribution (pyproject.toml). gemmar run from its source tree
without an install, or an editable install made before a hook was declared, has no such metadata: then the
declarations are read from the source tree's pyproject.toml itself. ``GEMMAR_PROGRAM_HOOKS`` adds or replaces hooks
(``name=module:attribute``, comma-separated). A hook is an object with:

- ``options``: ``{keyword: (default, metavar, help)}``: the keywords ``run_script`` and ``activate`` take for it,
  and the ``--keyword`` flags of ``gemmar run`` (a bool default makes a switch, anything else takes a value);
- ``choose(**options)``: on the client, before any rank starts: the options checked (a bad one is a one-line
  UsageError) into a plan, a picklable value that travels to every rank;
- ``describe(plan)``: the line a run says at its start (``[gemmar] name: ...``), or None;
- ``prepare_rank(plan)``: on each rank, after the kit has made the rank ready for a program and before the
  program runs.
"""

import importlib
import os
import re
from importlib import metadata

from ..errors import UsageError

ENTRY_POINT_GROUP = "gemmar.program_hooks"
ENVIRONMENT_VARIABLE = "GEMMAR_PROGRAM_HOOKS"


def _named():
    """{name: "module:attribute"} of every hook registered, the environment's last (it may replace one)."""
    named = {}
    # Every distribution's, not entry_points(group=)'s first of each name: a stale gemmar.egg-info left in a
    # source tree (the current folder comes first on sys.path) would hide the installed one's hooks.
    for distribution in metadata.distributions():
        for point in distribution.entry_points:
            if point.group == ENTRY_POINT_GROUP:
                named.setdefault(point.name, point.value)
    for name, target in _declared_in_source_tree().items():
        named.setdefault(name, target)
    for item in filter(None, (part.strip() for part in os.environ.get(ENVIRONMENT_VARIABLE, "").split(","))):
        name, _, target = item.partition("=")
        if not name or ":" not in target:
            raise UsageError(f"{ENVIRONMENT_VARIABLE}: {item!r} is not name=module:attribute")
        named[name.strip()] = target.strip()
    return named


def _declared_in_source_tree():
    """The hooks the source tree's pyproject.toml declares (its ``[project.entry-points."gemmar.program_hooks"]``
    table), when gemmar runs from a checkout; {} for an installed wheel, which has no pyproject.toml beside it."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "pyproject.toml")
    try:
        text = open(path, encoding="utf-8").read()
    except OSError:
        return {}
    table = re.search(r'^\[project\.entry-points\."' + re.escape(ENTRY_POINT_GROUP) + r'"\]\n(.*?)(?=^\[|\Z)', text,
                      re.MULTILINE | re.DOTALL)
    return dict(re.findall(r'^(\w+)\s*=\s*"([\w.]+:\w+)"', table.group(1), re.MULTILINE)) if table else {}


def _load(name, target):
    module, _, attribute = target.partition(":")
    try:
        hook = getattr(importlib.import_module(module), attribute)
    except Exception as e:  # noqa: BLE001 - whatever a layer's module raises is said in one line
        raise UsageError(f"program hook {name!r} ({target}) cannot be loaded: {type(e).__name__}: {e}") from None
    missing = [a for a in ("options", "choose", "describe", "prepare_rank") if not hasattr(hook, a)]
    if missing:
        raise UsageError(f"program hook {name!r} ({target}) has no {', '.join(missing)}: not a program hook")
    return hook


def _registered():
    """{name: (its module:attribute, hook)} of every registered hook, in name order (so every rank prepares in the
    same order), read once for a caller that needs both."""
    return {name: (target, _load(name, target)) for name, target in sorted(_named().items())}


def hooks():
    """{name: hook} of every registered hook, in name order."""
    return {name: hook for name, (_, hook) in _registered().items()}


def options(registered=None):
    """{keyword: (hook name, default, metavar, help)} over every hook (of ``registered``, else of those registered)."""
    registered = _registered() if registered is None else registered
    return {keyword: (name, *spec) for name, (_, hook) in registered.items() for keyword, spec in hook.options.items()}


def add_arguments(parser):
    """Every hook's options as ``--keyword`` flags of ``parser`` (``gemmar run``); :func:`given` reads them back."""
    for keyword, (_, default, metavar, text) in options().items():
        if isinstance(default, bool):
            parser.add_argument(f"--{keyword}", action="store_true", default=default, help=text)
        else:
            parser.add_argument(f"--{keyword}", metavar=metavar, default=default, help=text)


def given(args):
    """The hook options of parsed ``gemmar run`` arguments, as keywords for ``run_script``."""
    return {keyword: getattr(args, keyword) for keyword in options()}


def plans(given):
    """Each hook's plan from the keywords ``given`` (a keyword no hook takes is refused in one line), as
    {name: (its module:attribute, plan)}: a rank loads the hook the client chose, whatever it finds registered."""
    registered = _registered()
    known = options(registered)
    unknown = sorted(set(given) - set(known))
    if unknown:
        allowed = ", ".join(sorted(known)) or ("none: no program hook is registered (an editable install made "
                                               "before this gemmar: run pip install -e . again)")
        raise UsageError(f"{', '.join(unknown)}: not a keyword of a program run; allowed: {allowed}")
    return {name: (target, hook.choose(**{k: v for k, v in given.items() if known[k][0] == name}))
            for name, (target, hook) in registered.items()}


def descriptions(made):
    """'name: line' for each plan whose hook describes it."""
    lines = [(name, _load(name, target).describe(plan)) for name, (target, plan) in made.items()]
    return [f"{name}: {line}" for name, line in lines if line]


def prepare_rank(made):
    """On a rank: every chosen hook's ``prepare_rank`` with its plan, in name order."""
    for name, (target, plan) in sorted(made.items()):
        _load(name, target).prepare_rank(plan)
