"""The one error type of request validation."""
from __future__ import annotations


class RequestError(ValueError):
    """A client error in one request; ``field`` names the Triton input at fault.

    ``str(err)`` starts with the field name (``"top_p: must be > 0.0, got 0.0"``), so the adapter
    can return it as the response's error message unchanged.
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
