"""The one error type of the grammar layer."""
from __future__ import annotations

GUIDE = "guided_decoding_guide"            # the ensemble input holding the schema, pattern or grammar
GUIDE_TYPE = "guided_decoding_guide_type"  # the ensemble input naming the kind of guide


class GuideError(ValueError):
    """A guide that cannot be served; ``field`` is the ensemble input at fault.

    ``str(err)`` starts with the field name (``"guided_decoding_guide: ..."``), the convention of
    every client error in this pipeline (preprocess's ``RequestError``, the engine's ``ValueError``).
    """

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
