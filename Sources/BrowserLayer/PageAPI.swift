import GuidedAccessCore

/// (1.2) The page API in one browser's pages: which origins get
/// `window.guidedAccess`, who their calls come from, and where they go.
public struct PageAPI: Sendable {
    /// `[Browser] AllowOrigins=`, exact origins (`BrowserOrigin`).
    let allowed: Set<String>
    /// Whom a page of this browser calls as: the launcher that attached it
    /// (the service itself for `DevToolsEndpoint`), with the page's origin
    /// and tab added per call.
    let caller: BusCaller
    let handlers: PageHandlers
    /// The document script that defines `guidedAccess`.
    let script: String

    init(allowed: Set<String>, caller: BusCaller, handlers: PageHandlers) {
        self.allowed = allowed
        self.caller = caller
        self.handlers = handlers
        script = Self.script(allowed: allowed)
    }

    /// The function Chromium puts in every context of an attached page
    /// (`Runtime.addBinding`); what calls it is checked against the
    /// browser's own record of the calling context, not taken on trust.
    static let binding = "__guidedAccessBinding"
    /// Where the service's answers and events go in a page (`Runtime.evaluate`).
    static let receiver = "__guidedAccessReceive"
    /// A call with no answer after this long rejects with `NoReply` (a
    /// bus call's default timeout is 25 s).
    static let replyTimeoutSeconds = 30

    /// Defines `guidedAccess` in a top-level document of an allowed origin
    /// (elsewhere it does nothing: the origins are in it only so that
    /// others see `undefined`; what the service checks is the browser's
    /// record). Run before the page's scripts in each new document (a
    /// document loaded before the browser was attached is loaded again).
    /// Twice in one document: the second does nothing.
    static func script(allowed: Set<String>) -> String {
        let origins = String(decoding: JSON.array(allowed.sorted().map(JSON.string)).compactBytes(), as: UTF8.self)
        return """
            (() => {
            const allowed = \(origins);
            const binding = globalThis.\(binding);
            if (window.top !== window || !allowed.includes(location.origin) || typeof binding !== "function") return;
            if (Object.prototype.hasOwnProperty.call(window, "guidedAccess")) return;
            try { delete globalThis.\(binding); } catch (e) {}
            const api = new EventTarget();
            const pending = new Map();
            let next = 1;
            const failure = (name, message) => { const e = new Error(message); e.name = name; return e; };
            const call = (method, args) => new Promise((resolve, reject) => {
              let payload;
              const id = next++;
              try { payload = JSON.stringify({id, method, args}); }
              catch (e) { reject(failure("InvalidArgs", "the arguments cannot be sent: " + e.message)); return; }
              if (payload.length > \(PageCallLimits.callBytes)) { reject(failure("InvalidArgs", "the call's arguments are over \(PageCallLimits.callBytes >> 10) KiB")); return; }
              // No answer at all (the service went away as it was asked):
              // NoReply, as a bus call's, after the longest a call may take.
              const timer = setTimeout(() => {
                if (pending.delete(id)) reject(failure("NoReply", "no answer from the GuidedAccess service within \(replyTimeoutSeconds) s"));
              }, \(replyTimeoutSeconds * 1000));
              pending.set(id, {resolve: (v) => { clearTimeout(timer); resolve(v); }, reject: (e) => { clearTimeout(timer); reject(e); }});
              binding(payload);
            });
            const methods = {
              startSession: (options) => call("startSession", options === undefined ? [] : [options]),
              configureForSession: (features, enabled) => call("configureForSession", [features, enabled]),
              endSession: () => call("endSession", []),
              getState: () => call("getState", []),
              registerRestrictions: (restrictions) => call("registerRestrictions", [restrictions]),
              unregisterRestrictions: (ids) => call("unregisterRestrictions", [ids]),
              restrictionState: (id) => call("restrictionState", [id]),
            };
            for (const [name, f] of Object.entries(methods)) Object.defineProperty(api, name, {value: f, enumerable: true});
            Object.defineProperty(window, "\(receiver)", {value: (m) => {
              if (m.event) { api.dispatchEvent(new CustomEvent(m.event, {detail: m.detail})); return; }
              const p = pending.get(m.id);
              if (!p) return;
              pending.delete(m.id);
              if (m.error) p.reject(failure(m.error.name, m.error.message));
              else p.resolve(m.result === null ? undefined : m.result);
            }});
            Object.defineProperty(window, "guidedAccess", {value: api, enumerable: true});
            })()
            """
    }

    /// `Runtime.evaluate`'s expression that hands `message` to the page.
    static func delivery(_ message: JSON) -> String {
        "globalThis.\(receiver) && globalThis.\(receiver)(" + String(decoding: message.compactBytes(), as: UTF8.self) + ")"
    }
}
