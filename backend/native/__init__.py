"""Native CPU kernels: C++ sources in ``csrc/``, compiled at first use by torch's JIT extension
builder into one shared library under ``.cache/native/``, registered as ``torch.ops.triton_llm.*``.

Each ``csrc/*.cpp`` adds its own ops with ``TORCH_LIBRARY_FRAGMENT(triton_llm, m)``, so kernels
stay independent files. ``native_ops()`` returns a ``NativeBuild``: the ops namespace, or why it
is unavailable (no compiler, ``TRITON_LLM_NATIVE=0``, a failed build); callers then take their
torch path. Nothing here runs at import; the names load ``build`` on first access, so that
``python -m backend.native.build`` runs that module once, as ``__main__``.
"""
__all__ = ["NativeBuild", "native_ops"]


def __getattr__(name: str):
    if name in __all__:
        from backend.native import build
        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
