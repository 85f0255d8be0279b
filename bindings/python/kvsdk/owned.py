"""OwnedHandle: the one place that releases a kvsdk handle (close, `with`, garbage collection)."""


class OwnedHandle:
    """Base of every class that owns one kvsdk handle in `self._handle`. Subclasses define
    `_destroy(handle)` calling their kvsdk_*_destroy; close() calls it once and is safe to
    repeat."""

    def close(self):
        if getattr(self, "_handle", None) is not None:
            self._destroy(self._handle)
            self._handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
