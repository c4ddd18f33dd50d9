"""Speculative decoding: proposers of draft tokens (n-gram prompt lookup, a draft model) and the
adaptive choice of how many to propose. Verification (one target forward over every draft) lives
in the model runner, the rejection rule in ``backend/sampling/rejection.py``; terms are defined in
``backend/core/plan.py``."""
