import CKVSDK

/// A `kvsdk_status` other than OK (numbers match the header).
public enum Status: Equatable {
    case invalidArg, outOfRange, budget, noMemory, unsupported, io, corrupt, version, geometry,
         state, backend, internalError
    case unknown(Int32)

    /// Known statuses in header order: `known[i]` has the number i + 1.
    static let known: [Status] = [.invalidArg, .outOfRange, .budget, .noMemory, .unsupported,
                                  .io, .corrupt, .version, .geometry, .state, .backend,
                                  .internalError]

    public init(raw: Int32) {
        self = (raw >= 1 && Int(raw) <= Status.known.count) ? Status.known[Int(raw) - 1]
                                                            : .unknown(raw)
    }

    public var raw: Int32 {
        if case .unknown(let v) = self { return v }
        return Int32(Status.known.firstIndex(of: self)! + 1)
    }

    /// The library's short description.
    public var description: String { String(cString: kvsdk_status_str(raw)) }
}

/// Thrown by every failed call: the status and the library's detail message.
public struct KVSDKError: Error, CustomStringConvertible {
    public let status: Status
    public let message: String
    public var description: String { "\(status.description): \(message)" }
}

/// Throws for a non-OK status, reading the thread-local detail right away.
@inline(__always)
func check(_ status: kvsdk_status) throws {
    let raw = Int32(truncatingIfNeeded: status.rawValue)
    if raw != 0 {
        throw KVSDKError(status: Status(raw: raw), message: String(cString: kvsdk_last_error()))
    }
}

func invalidArgument(_ message: String) -> KVSDKError {
    KVSDKError(status: .invalidArg, message: message)
}

/// Run-time version of the linked library (major * 10000 + minor * 100 + patch).
public func version() -> UInt32 { kvsdk_version() }

/// Run-time version as "MAJOR.MINOR.PATCH".
public func versionString() -> String { String(cString: kvsdk_version_string()) }

/// Major version of the header this package was compiled against.
public let headerVersionMajor = UInt32(KVSDK_VERSION_MAJOR)
