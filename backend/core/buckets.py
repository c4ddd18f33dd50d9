"""Power-of-two buckets: the key under which per-batch-size measurements are pooled."""


def bucket(n: int) -> int:
    """The power of two at or above ``n`` (1 for ``n <= 1``)."""
    return 1 << max(0, n - 1).bit_length()
