// swift-tools-version:5.7
// kvsdk for Swift: a C module over include/kvsdk.h and the `KVSDK` wrapper on top of it.
// Build against the CMake build tree:  ./check.sh ../../build/dev
// (or: swift build -Xlinker -L<dir with libkvsdk.so>; an installed kvsdk is found by pkg-config).
import PackageDescription

let package = Package(
    name: "KVSDK",
    products: [
        .library(name: "KVSDK", targets: ["KVSDK"]),
        .executable(name: "kvsdk-swift-sample", targets: ["KVSDKSample"]),
    ],
    targets: [
        // The C ABI as a Clang module; links libkvsdk.
        .systemLibrary(name: "CKVSDK", path: "Sources/CKVSDK", pkgConfig: "kvsdk"),
        .target(name: "KVSDK", dependencies: ["CKVSDK"]),
        .executableTarget(name: "KVSDKSample", dependencies: ["KVSDK"]),
        .testTarget(name: "KVSDKTests", dependencies: ["KVSDK"]),
    ]
)
