"""Which Triton releases gemmar accepts, and the one work-around an accepted release needs.

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


check_release(triton.__version__)
if release(triton.__version__) == (3, 6):
    _patch_interpreter()
