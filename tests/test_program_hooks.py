"""The kit's one program hook (gemmar/programs/hooks.py): the Iris layer is found through its entry point, never
imported by the kit; a layer named in GEMMAR_PROGRAM_HOOKS plugs in the same way; a keyword no hook takes is
refused in one line naming what is allowed."""

import sys
import types

import pytest

from gemmar.errors import UsageError
from gemmar.programs import hooks


def test_the_iris_layer_is_found_through_its_entry_point():
    found = hooks.hooks()
    assert type(found["iris"]).__module__ == "gemmar.iris.hook"
    assert set(hooks.options()) >= {"iris", "replace_iris"}
    assert hooks.plans({"replace_iris": True})["iris"] == ("gemmar.iris.hook:HOOK", "gemmar")   # the stand-in


def test_a_source_tree_without_install_metadata_still_finds_the_iris_layer(monkeypatch):
    """Run from a checkout with no metadata declaring the hook (never pip-installed, or an editable install made
    before the hook existed): the source tree's pyproject.toml declares it."""
    monkeypatch.setattr(hooks.metadata, "distributions", lambda: [])
    monkeypatch.delenv(hooks.ENVIRONMENT_VARIABLE, raising=False)
    assert hooks._named() == {"iris": "gemmar.iris.hook:HOOK"}


def test_a_keyword_no_hook_takes_is_refused_in_one_line():
    with pytest.raises(UsageError) as refused:
        hooks.plans({"irs": "/tmp"})
    assert str(refused.value) == "irs: not a keyword of a program run; allowed: iris, replace_iris"


def test_a_layer_named_in_the_environment_plugs_in_and_prepares_ranks(monkeypatch):
    prepared = []
    layer = types.ModuleType("a_test_layer")
    layer.HOOK = types.SimpleNamespace(options={"greeting": ("hi", "WORD", "what to say")},
                                       choose=lambda greeting="hi": greeting.upper(),
                                       describe=lambda plan: f"says {plan}", prepare_rank=prepared.append)
    monkeypatch.setitem(sys.modules, "a_test_layer", layer)
    monkeypatch.setenv(hooks.ENVIRONMENT_VARIABLE, "greeter=a_test_layer:HOOK")
    plans = hooks.plans({"greeting": "hello"})
    assert plans["greeter"] == ("a_test_layer:HOOK", "HELLO") and "greeter: says HELLO" in hooks.descriptions(plans)
    monkeypatch.delenv(hooks.ENVIRONMENT_VARIABLE)   # (a rank loads the hook the client chose, registered or not)
    hooks.prepare_rank({"greeter": plans["greeter"]})
    assert prepared == ["HELLO"]
    monkeypatch.setenv(hooks.ENVIRONMENT_VARIABLE, "greeter=a_test_layer:NOTHING")
    with pytest.raises(UsageError, match=r"program hook 'greeter' \(a_test_layer:NOTHING\) cannot be loaded: "
                                         r"AttributeError"):
        hooks.hooks()
    monkeypatch.setenv(hooks.ENVIRONMENT_VARIABLE, "greeter=a_test_layer")   # no attribute
    with pytest.raises(UsageError, match=r"GEMMAR_PROGRAM_HOOKS: 'greeter=a_test_layer' is not name=module:attribute"):
        hooks.hooks()
