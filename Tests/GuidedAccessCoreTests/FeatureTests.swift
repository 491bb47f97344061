import Testing
@testable import GuidedAccessCore

@Suite struct FeatureTests {
    @Test func everyFeatureParsesFromItsWireName() throws {
        for feature in Feature.allCases {
            #expect(try Feature(wireName: feature.wireName) == feature)
        }
        #expect(Feature.allCases.count == 8)
    }

    @Test func anUnknownFeatureIsUnknownFeatureNamingIt() {
        #expect(throws: GuidedAccessError.unknownFeature("unknown feature 'teleport'")) {
            try Feature.parse(["zoom", "teleport"])
        }
    }

    @Test func aFeatureNamedTwiceIsInvalidArgsNamingIt() {
        #expect(throws: GuidedAccessError.invalidArgs("feature 'zoom' is named twice")) {
            try Feature.parse(["zoom", "grayscale", "zoom"])
        }
    }

    @Test func aRepeatedNameIsFoundBeforeAnUnknownOne() {
        // Arguments first, as the API orders its errors.
        #expect(throws: GuidedAccessError.invalidArgs("feature 'zoom' is named twice")) {
            try Feature.parse(["teleport", "zoom", "zoom"])
        }
    }

    @Test func everyFeatureOnceIsTheLongestValidList() throws {
        #expect(try Feature.parse(Feature.allCases.map(\.wireName)) == Set(Feature.allCases))
    }

    @Test func featuresSortByWireName() {
        #expect(Feature.allCases.sorted().map(\.wireName) == [
            "grayscale", "high-contrast", "invert-colors", "large-text",
            "on-screen-keyboard", "reduce-motion", "screen-reader", "zoom",
        ])
    }

    @Test func invalidArgsUsesTheFreedesktopErrorName() {
        #expect(GuidedAccessError.invalidArgs("x").dbusErrorName == "org.freedesktop.DBus.Error.InvalidArgs")
        #expect(GuidedAccessError.limitExceeded("x").dbusErrorName == "org.guidedaccess.GuidedAccess1.Error.LimitExceeded")
    }
}

@Suite struct FeatureOrderTests {
    /// `<` (and hashing) go by a table, not by the names: it must be the
    /// names' own order, so every sorted list the API sends is sorted as strings.
    @Test func theOrderIsTheWireNamesOrderAsStrings() {
        #expect(Feature.allCases.sorted().map(\.wireName) == Feature.allCases.map(\.wireName).sorted())
    }

    @Test func equalSettingKeysHashAlikeAndDifferentOnesDiffer() {
        let a = SettingKey(schema: "org.gnome.desktop.a11y.magnifier", key: "mag-factor")
        #expect(a == SettingKey.magFactor && a.hashValue == SettingKey.magFactor.hashValue)
        // The separator keeps "a.b" + "c" apart from "a" + "b.c".
        #expect(SettingKey(schema: "ab", key: "c") != SettingKey(schema: "a", key: "bc"))
        #expect(Set(FeatureKeyMap.allRequirements.map(\.key)).count == FeatureKeyMap.allRequirements.count)
    }
}
