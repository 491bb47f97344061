import Testing
@testable import GuidedAccessCore

@Suite struct FeatureKeyMapTests {
    let options = FeatureKeyMap.Options(zoomFactor: 3.0, textScale: 1.25)
    let gnome43 = FeatureKeyMap(missingOptionalKeys: [.reducedMotion])
    let gnome50 = FeatureKeyMap()

    @Test func noFeaturesRequireNoKeys() {
        #expect(gnome50.keyValues(for: [], options: options).isEmpty)
    }

    @Test func zoomTurnsOnTheFullScreenMagnifierAtTheZoomFactor() {
        #expect(gnome43.keyValues(for: [.zoom], options: options) == [
            .screenMagnifierEnabled: .bool(true),
            .magFactor: .double(3.0),
            .screenPosition: .string("full-screen"),
        ])
    }

    @Test func grayscaleAloneDesaturatesThroughTheMagnifierAtFactorOne() {
        #expect(gnome43.keyValues(for: [.grayscale], options: options) == [
            .screenMagnifierEnabled: .bool(true),
            .magFactor: .double(1.0),
            .screenPosition: .string("full-screen"),
            .colorSaturation: .double(0.0),
        ])
    }

    @Test func invertOffWhileZoomOnKeepsMagFactorAtTheZoomFactor() {
        let change = gnome43.change(from: [.zoom, .invertColors], to: [.zoom], options: options)
        #expect(change.write.isEmpty)
        #expect(change.restore == [.invertLightness])
    }

    @Test func zoomOffWhileInvertOnSetsMagFactorToOne() {
        let change = gnome43.change(from: [.zoom, .invertColors], to: [.invertColors], options: options)
        #expect(change.write == [.magFactor: .double(1.0)])
        #expect(change.restore.isEmpty)
    }

    @Test func lastMagnifierFeatureOffGivesBackEveryMagnifierKey() {
        let change = gnome43.change(from: [.grayscale], to: [], options: options)
        #expect(change.write.isEmpty)
        #expect(change.restore == [.screenMagnifierEnabled, .magFactor, .screenPosition, .colorSaturation])
    }

    @Test func turningOnAFeatureThatIsOnChangesNothing() {
        #expect(gnome43.change(from: [.zoom], to: [.zoom], options: options).isEmpty)
    }

    @Test func allEightFeaturesMapEveryKey() {
        #expect(gnome50.keyValues(for: Set(Feature.allCases), options: options) == [
            .screenReaderEnabled: .bool(true),
            .screenMagnifierEnabled: .bool(true),
            .magFactor: .double(3.0),
            .screenPosition: .string("full-screen"),
            .invertLightness: .bool(true),
            .colorSaturation: .double(0.0),
            .highContrast: .bool(true),
            .textScalingFactor: .double(1.25),
            .screenKeyboardEnabled: .bool(true),
            .enableAnimations: .bool(false),
            .reducedMotion: .string("reduce"),
        ])
    }

    @Test func reduceMotionWritesReducedMotionOnlyWhereTheKeyExists() {
        #expect(gnome43.keyValues(for: [.reduceMotion], options: options) == [.enableAnimations: .bool(false)])
        #expect(gnome50.keyValues(for: [.reduceMotion], options: options)[.reducedMotion] == .string("reduce"))
    }

    @Test func magnifierFeaturesRequireTheMagnifierKeys() {
        #expect(FeatureKeyMap.requirements(of: .invertColors).map(\.key) ==
            [.screenMagnifierEnabled, .invertLightness, .magFactor, .screenPosition])
    }
}
