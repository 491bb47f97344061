import Testing
@testable import GuidedAccessCore

@Suite struct SessionParametersTests {
    let defaults = SessionDefaults(timeLimitSec: 600, inhibitSleep: true, zoomFactor: 2.0, textScale: 1.5)

    func parse(_ options: [String: OptionValue]) throws(GuidedAccessError) -> SessionParameters {
        try SessionParameters(parsing: options, defaults: defaults)
    }

    @Test func noOptionsTakeTheDefaults() throws {
        let options = try parse([:])
        #expect(options == SessionParameters(timeLimitSec: 600, features: [], zoomFactor: 2.0, textScale: 1.5, inhibitSleep: true))
    }

    @Test func everyOptionIsTaken() throws {
        let options = try parse([
            "time-limit": .uint64(2_678_400), "features": .stringArray(["zoom", "grayscale"]),
            "zoom-factor": .double(32.0), "text-scale": .double(1.0), "inhibit-sleep": .bool(false),
        ])
        #expect(options == SessionParameters(
            timeLimitSec: 2_678_400, features: [.zoom, .grayscale], zoomFactor: 32.0, textScale: 1.0, inhibitSleep: false))
    }

    @Test func zoomFactorOutOfRangeNamesTheValue() {
        #expect(throws: GuidedAccessError.invalidArgs("zoom-factor 40.0 is out of range 1.0…32.0")) {
            try parse(["zoom-factor": .double(40.0)])
        }
    }

    @Test func textScaleOutOfRangeNamesTheValue() {
        #expect(throws: GuidedAccessError.invalidArgs("text-scale 0.5 is out of range 1.0…3.0")) {
            try parse(["text-scale": .double(0.5)])
        }
    }

    @Test func notANumberIsOutOfRange() {
        #expect(throws: GuidedAccessError.invalidArgs("zoom-factor nan is out of range 1.0…32.0")) {
            try parse(["zoom-factor": .double(.nan)])
        }
    }

    @Test func timeLimitOverThirtyOneDaysNamesTheValue() {
        #expect(throws: GuidedAccessError.invalidArgs("time-limit 2678401 is out of range 0…2678400")) {
            try parse(["time-limit": .uint64(2_678_401)])
        }
    }

    @Test func anUnknownOptionNamesTheKey() {
        #expect(throws: GuidedAccessError.invalidArgs("unknown option 'speed' (value 2.0)")) {
            try parse(["speed": .double(2.0)])
        }
    }

    @Test func aWrongTypeNamesKeyValueAndTypes() {
        #expect(throws: GuidedAccessError.invalidArgs("time-limit 2.5 has type 'd', expected 't'")) {
            try parse(["time-limit": .double(2.5)])
        }
        #expect(throws: GuidedAccessError.invalidArgs("inhibit-sleep has type 'i', expected 'b'")) {
            try parse(["inhibit-sleep": .other(signature: "i")])
        }
    }

    @Test func invalidArgsComeBeforeUnknownFeature() {
        #expect(throws: GuidedAccessError.invalidArgs("zoom-factor 0.0 is out of range 1.0…32.0")) {
            try parse(["features": .stringArray(["teleport"]), "zoom-factor": .double(0.0)])
        }
    }

    @Test func aFeatureNamedTwiceInOptionsIsInvalidArgs() {
        #expect(throws: GuidedAccessError.invalidArgs("feature 'zoom' is named twice")) {
            try parse(["features": .stringArray(["zoom", "zoom"])])
        }
    }

    @Test func anUnknownFeatureInOptionsIsUnknownFeature() {
        #expect(throws: GuidedAccessError.unknownFeature("unknown feature 'teleport'")) {
            try parse(["features": .stringArray(["teleport"])])
        }
    }
}
