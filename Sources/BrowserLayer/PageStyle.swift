import GuidedAccessAPI

/// What the browser layer shows in every page for a session: its features
/// that the browser realises, and their factors.
public struct BrowserLook: Hashable, Sendable, CustomStringConvertible {
    /// The features the browser layer can realise in a page.
    public static let realisable: Set<Feature> = [.zoom, .invertColors, .grayscale, .highContrast, .largeText, .reduceMotion]

    public var features: Set<Feature>
    public var zoomFactor: Double
    public var textScale: Double

    public init(features: Set<Feature>, zoomFactor: Double, textScale: Double) {
        self.features = features.intersection(Self.realisable)
        self.zoomFactor = zoomFactor
        self.textScale = textScale
    }

    public var description: String {
        features.sortedWireNames.joined(separator: ", ") + " (zoom \(zoomFactor), text \(textScale))"
    }

    // MARK: How each feature is made

    /// `Emulation.setEmulatedMedia`'s features: what the page's
    /// `matchMedia` and CSS media queries see. Cleared by Chromium when the
    /// layer's connection closes.
    var mediaFeatures: [(name: String, value: String)] {
        var media: [(String, String)] = []
        if features.contains(.highContrast) {
            media.append(("prefers-contrast", "more"))
            media.append(("forced-colors", "active"))
        }
        if features.contains(.reduceMotion) { media.append(("prefers-reduced-motion", "reduce")) }
        return media
    }

    /// `Emulation.setEmulatedVisionDeficiency`'s type: rendered over the
    /// whole page; cleared with the connection.
    var visionDeficiency: String { features.contains(.grayscale) ? "achromatopsia" : "none" }

    /// The style sheet for the page's root, or nil: what no emulation does.
    /// It stays in the document when the connection closes, so the layer
    /// removes it (also a restarted service, from a page it finds it on).
    /// - zoom: CSS `zoom`, which magnifies and reflows as the browser's own
    ///   zoom does (page scale would stay across reloads, and shows only a
    ///   corner of the page on a kiosk without pinch gestures);
    /// - invert-colors: `filter: invert(1)`, 1 − L per channel;
    /// - large-text: the root's font size, scaling text sized from the
    ///   browser's default (rem, em, %, keywords).
    var styleSheet: String? {
        var declarations: [String] = []
        if features.contains(.invertColors) { declarations.append("filter: invert(1) !important") }
        if features.contains(.zoom) { declarations.append("zoom: \(Self.number(zoomFactor)) !important") }
        if features.contains(.largeText) { declarations.append("font-size: \(Self.number(textScale * 100))% !important") }
        return declarations.isEmpty ? nil : "html { " + declarations.joined(separator: "; ") + " }"
    }

    /// A CSS number: plain decimal digits (factors are 1…32).
    static func number(_ value: Double) -> String {
        let thousandths = Int((value * 1000).rounded())
        let whole = thousandths / 1000, fraction = thousandths % 1000
        guard fraction != 0 else { return String(whole) }
        var digits = String(fraction)
        digits = String(repeating: "0", count: 3 - digits.count) + digits
        while digits.hasSuffix("0") { digits.removeLast() }
        return "\(whole).\(digits)"
    }
}

/// The script that puts a style sheet on a document, or takes the layer's
/// off: a constructed sheet in `document.adoptedStyleSheets`, not a DOM
/// node the page's own scripts would see or move, held under a registered
/// symbol so that a later run — also of a restarted service — finds it.
/// The service's own text only: nothing from the page goes into it.
enum PageScript {
    static let key = "org.guidedaccess.browser-layer"

    static func applying(_ styleSheet: String?) -> String {
        let sheet = styleSheet.map { "\"" + $0.replacingQuoted() + "\"" } ?? "null"
        return """
            (() => { const key = Symbol.for("\(key)"); const css = \(sheet); \
            const old = document[key]; \
            const sheets = document.adoptedStyleSheets.filter((s) => s !== old); \
            if (css === null) { delete document[key]; } \
            else { const s = new CSSStyleSheet(); s.replaceSync(css); document[key] = s; sheets.push(s); } \
            document.adoptedStyleSheets = sheets; })()
            """
    }
}

extension String {
    /// For a JavaScript string literal in double quotes: only the style
    /// sheet above goes in, whose characters are ours, but escape anyway.
    fileprivate func replacingQuoted() -> String {
        var out = ""
        for scalar in unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case _ where scalar.value < 0x20 || scalar.value > 0x7E: out += "\\u{\(String(scalar.value, radix: 16))}"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }
}
