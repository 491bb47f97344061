// swift-tools-version:6.0
// The memory floor of any static Swift service: a program that prints one
// line and waits, built as guidedaccessd is (release, --static-swift-stdlib).
// scripts/bench-service measures its VmRSS beside guidedaccessd's.
import PackageDescription

let package = Package(name: "static-floor", targets: [.executableTarget(name: "static-floor")])
