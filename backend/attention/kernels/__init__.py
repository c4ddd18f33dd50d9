"""OpenAI Triton kernels for paged attention (GPU; CPU tests run them under TRITON_INTERPRET=1).

Submodules import ``triton`` at import time and decide then whether they run compiled or
interpreted, so nothing here is imported eagerly: import the submodule you need.
"""
