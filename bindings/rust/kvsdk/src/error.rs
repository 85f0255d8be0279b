//! Status codes and the error type: every failure carries the status and the library's
//! thread-local detail message, captured right after the failing call.
use crate::sys;
use std::fmt;

/// A `kvsdk_status` other than OK. `Unknown` keeps values from a newer library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArg,
    OutOfRange,
    Budget,
    NoMemory,
    Unsupported,
    Io,
    Corrupt,
    Version,
    Geometry,
    State,
    Backend,
    Internal,
    Unknown(i32),
}

impl Status {
    pub fn from_raw(raw: i32) -> Status {
        match raw {
            sys::KVSDK_E_INVALID_ARG => Status::InvalidArg,
            sys::KVSDK_E_OUT_OF_RANGE => Status::OutOfRange,
            sys::KVSDK_E_BUDGET => Status::Budget,
            sys::KVSDK_E_NO_MEMORY => Status::NoMemory,
            sys::KVSDK_E_UNSUPPORTED => Status::Unsupported,
            sys::KVSDK_E_IO => Status::Io,
            sys::KVSDK_E_CORRUPT => Status::Corrupt,
            sys::KVSDK_E_VERSION => Status::Version,
            sys::KVSDK_E_GEOMETRY => Status::Geometry,
            sys::KVSDK_E_STATE => Status::State,
            sys::KVSDK_E_BACKEND => Status::Backend,
            sys::KVSDK_E_INTERNAL => Status::Internal,
            other => Status::Unknown(other),
        }
    }

    pub fn raw(self) -> i32 {
        match self {
            Status::InvalidArg => sys::KVSDK_E_INVALID_ARG,
            Status::OutOfRange => sys::KVSDK_E_OUT_OF_RANGE,
            Status::Budget => sys::KVSDK_E_BUDGET,
            Status::NoMemory => sys::KVSDK_E_NO_MEMORY,
            Status::Unsupported => sys::KVSDK_E_UNSUPPORTED,
            Status::Io => sys::KVSDK_E_IO,
            Status::Corrupt => sys::KVSDK_E_CORRUPT,
            Status::Version => sys::KVSDK_E_VERSION,
            Status::Geometry => sys::KVSDK_E_GEOMETRY,
            Status::State => sys::KVSDK_E_STATE,
            Status::Backend => sys::KVSDK_E_BACKEND,
            Status::Internal => sys::KVSDK_E_INTERNAL,
            Status::Unknown(v) => v,
        }
    }

    /// The library's short description ("memory budget exceeded", ...).
    pub fn description(self) -> &'static str {
        // SAFETY: any int32 is accepted; the result is static.
        unsafe { crate::static_str(sys::kvsdk_status_str(self.raw())) }
    }
}

/// A failed call: its status and the library's detail message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An error raised by this crate before calling the library (e.g. mismatched slice lengths).
    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error { status: Status::InvalidArg, message: message.into() }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.description(), self.message)
    }
}

impl std::error::Error for Error {}

/// Turns a status into a Result, reading kvsdk_last_error on the same thread at once (the
/// message is only valid until the next kvsdk call).
pub(crate) fn check(raw: i32) -> Result<()> {
    if raw == sys::KVSDK_OK {
        return Ok(());
    }
    // SAFETY: never NULL; copied before any other kvsdk call.
    let message = unsafe { crate::static_str(sys::kvsdk_last_error()) }.to_owned();
    Err(Error { status: Status::from_raw(raw), message })
}
