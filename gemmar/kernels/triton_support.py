"""Which Triton releases gemmar accepts, the one work-around an accepted release needs, and a faster interpreter.

Imported by ``gemmar.kernels`` before any kernel is defined, so both take effect wherever a kernel can run
(the client, every engine, a notebook).

Triton 3.6's interpreter turns a scalar into a Python int with ``int(array)``, and its scalars (e.g.
``tl.program_id``) are one-element 1-D numpy arrays. NumPy 2.4 refuses ``int()`` of an array that is not
0-D, so under 3.6 with a current NumPy every ``range(pid, ...)`` in a kernel failed with "only 0-dimensional
arrays can be converted to Python scalars". Triton 3.7 squeezes the array first; :func:`_patch_interpreter`
does the same for 3.6. Compiled kernels never reach this code.
"""

import triton

from ..errors import UsageError

# The accepted releases: what pyproject.toml allows and CI runs (the full suite on one, a smoke run on the rest).
ACCEPTED = ((3, 6), (3, 10))   # lowest accepted, first refused
ACCEPTED_TEXT = "3.6 to 3.9"


def release(version_text):
    """'3.6.0' / '3.9.0+git1234' -> (3, 6)."""
    parts = version_text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise UsageError(f"cannot read Triton's version {version_text!r}: gemmar needs Triton "
                         f"{ACCEPTED_TEXT}") from None


def check_release(version_text):
    """One line naming the installed version and the accepted range, when it is outside it."""
    if not ACCEPTED[0] <= release(version_text) < ACCEPTED[1]:
        raise UsageError(f"Triton {version_text} is installed; gemmar needs Triton {ACCEPTED_TEXT} "
                         f"(pip install 'triton>=3.6,<3.10')")


def _patch_interpreter():
    """Triton 3.6 only: make the interpreter's ``__index__`` accept one-element arrays (see the module doc)."""
    from triton.runtime import interpreter

    patch_tensor = interpreter._patch_lang_tensor

    def patch_tensor_squeezing(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_tensor_squeezing


class _KernelPatches:
    """The language patches of one interpreted kernel launch: undone by the launch's ``restore()``, which also
    ends the launch for :func:`_patch_once_per_launch`."""

    def __init__(self, scope, state):
        self.scope, self.state = scope, state

    def restore(self):
        self.state["langs"] = None
        self.scope.restore()


class _NothingPatched:
    def restore(self):
        pass


def _patch_once_per_launch():
    """Patch Triton's language once per interpreted launch, not again at every call of a @triton.jit helper.

    The interpreter patches ``triton.language`` (its builtins, its tensor's methods) when a kernel launch
    starts, and again at each call of a device function from it, though the modules patched are the same
    objects: in the CPU suite that was half of the interpreter's time (a two_shot launch of 4 tiles, 10 of
    them: 2.6 s of 5.1 in ``_patch_lang``, nearly all in ``inspect.getmembers``). A device function whose
    language modules the running launch has patched already is called as it is; any other is patched as
    before. (The interpreter's patches are global, so it ran one launch at a time before this too.)"""
    import inspect

    import triton.language as tl
    from triton.runtime import interpreter

    patch_lang = interpreter._patch_lang
    state = {"langs": None}   # the language modules the running launch patched; None between launches

    def patch_lang_once_per_launch(fn):
        langs = {id(m) for m in fn.__globals__.values() if inspect.ismodule(m) and m in (tl, tl.core)}
        # (and only while the patches are in place: tl.load is then the interpreter's, not the builtin)
        if state["langs"] is not None and langs <= state["langs"] and not tl.core.is_builtin(tl.load):
            return _NothingPatched()
        scope = patch_lang(fn)
        if state["langs"] is None:   # a launch starts (the interpreter restores its patches when it ends)
            state["langs"] = langs
            return _KernelPatches(scope, state)
        return scope

    interpreter._patch_lang = patch_lang_once_per_launch


check_release(triton.__version__)
if release(triton.__version__) == (3, 6):
    _patch_interpreter()
_patch_once_per_launch()
