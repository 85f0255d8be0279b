"""Status codes and the exception every failed call raises."""
import enum

from ._capi import lib


class Status(enum.IntEnum):
    """kvsdk_status values (numbers match the header and never change)."""
    OK = 0
    INVALID_ARG = 1
    OUT_OF_RANGE = 2
    BUDGET = 3
    NO_MEMORY = 4
    UNSUPPORTED = 5
    IO = 6
    CORRUPT = 7
    VERSION = 8
    GEOMETRY = 9
    STATE = 10
    BACKEND = 11
    INTERNAL = 12


def status_str(status):
    """The library's short description of any status value."""
    return lib.kvsdk_status_str(int(status)).decode()


class KvsdkError(Exception):
    """A failed kvsdk call. `status` is a Status (or the raw int from a newer library),
    `message` the library's detail (kvsdk_last_error) captured right after the call."""

    def __init__(self, status, message):
        try:
            status = Status(status)
        except ValueError:
            pass
        self.status = status
        self.message = message
        super().__init__(f"{status_str(status)}: {message}")


def check(raw_status):
    """Raises KvsdkError for a non-OK status, reading the thread-local detail at once."""
    if raw_status != Status.OK:
        raise KvsdkError(raw_status, lib.kvsdk_last_error().decode(errors="replace"))


def invalid(message):
    """An error raised by the binding before calling the library."""
    return KvsdkError(Status.INVALID_ARG, message)
