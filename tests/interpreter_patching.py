"""Triton's CPU interpreter re-patches triton.language on every call of a @triton.jit helper.

A kernel launch under TRITON_INTERPRET=1 (GridExecutor.__call__) patches the language modules its
kernel's globals name (each builtin swapped for an interpreter version, found by walking the module
with inspect.getmembers) and restores them when the launch ends. Every call of a jit helper inside
the kernel (InterpretedFunction.__call__) walks and patches the same modules again, and never
restores what it set: while the launch's patches are in place the walk finds no builtin left to
swap, and the rest it sets (range, tensor.__index__, ...) are the same stateless replacements.
That walk runs once per helper call per program, and it is a large share of what the kernel
tests' interpreter does.

`install` makes a helper's patch a no-op when the running launch has already patched every
language module the helper's globals name; a helper naming another module (tl.core where the
kernel named only tl) is patched as before. The kernels run the same interpreted operations
either way, so no test's result depends on this.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any

_state = threading.local()


def install() -> None:
    """Wrap the interpreter's launch and patch functions; a Triton without them is left alone."""
    from triton.runtime import interpreter

    if getattr(interpreter, "_shardinfer_patch_once", False):
        return
    patch_lang = getattr(interpreter, "_patch_lang", None)
    executor = getattr(interpreter, "GridExecutor", None)
    scope_type = getattr(interpreter, "_LangPatchScope", None)
    if patch_lang is None or executor is None or scope_type is None:
        return
    tl = interpreter.tl
    launch = executor.__call__

    def lang_modules(fn: Any) -> set[int]:
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_once(fn: Any) -> Any:
        patched: set[int] | None = getattr(_state, "patched", None)
        if patched is None:  # outside a launch: as Triton does it
            return patch_lang(fn)
        wanted = lang_modules(fn)
        if wanted and wanted <= patched:
            return scope_type()  # this launch's patches already cover the helper
        scope = patch_lang(fn)
        patched |= wanted
        return scope

    def launch_patching_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = getattr(_state, "patched", None)
        _state.patched = set()
        try:
            return launch(self, *args, **kwargs)
        finally:
            _state.patched = outer

    interpreter._patch_lang = patch_once
    executor.__call__ = launch_patching_once
    interpreter._shardinfer_patch_once = True
