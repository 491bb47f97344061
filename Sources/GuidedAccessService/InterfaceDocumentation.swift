/// What `org.guidedaccess.GuidedAccess1` and each of its members are for,
/// carried by the introspection XML (`org.gtk.GDBus.DocString`). The full
/// reference, with examples, is docs/dbus-api.md.
enum InterfaceDocumentation {
    static let text: [String: String] = [
        "": """
        Guided Access for a Linux kiosk: accessibility features (screen reader, zoom, invert colors, \
        grayscale, high contrast, large text, on-screen keyboard, reduce motion) and custom restrictions \
        for the length of one customer's session, every change undone when it ends, also after a crash \
        or a reboot. Errors are org.guidedaccess.GuidedAccess1.Error.NotAuthorized, NotInSession, \
        SessionBusy, UnknownFeature, UnsupportedFeature, UnknownRestriction, LimitExceeded and \
        BackendFailed, each with a message naming the offending value; malformed arguments are \
        org.freedesktop.DBus.Error.InvalidArgs, and a polkit check that would need to ask the user, \
        on a call without the ALLOW_INTERACTIVE_AUTHORIZATION flag, is \
        org.freedesktop.DBus.Error.InteractiveAuthorizationRequired. Arguments are checked first, then whether the caller \
        is admitted, then the session's state, then ownership.
        """,
        "StartSession": """
        Begins a session owned by the caller (a client: [Clients] or polkit's \
        org.guidedaccess.GuidedAccess1.start-session). Options, all optional: time-limit (t, seconds, \
        0 = none, at most 2678400), features (as, turned on as part of starting, all or nothing), \
        zoom-factor (d, 1.0 to 32.0), text-scale (d, 1.0 to 3.0), inhibit-sleep (b). While a session \
        is active the call is SessionBusy, except a take-over: with empty options, by a caller with the \
        identity of an owner that has left the bus, which emits SessionChanged(true, "resumed"). \
        Errors: InvalidArgs, UnknownFeature, UnsupportedFeature, NotAuthorized, SessionBusy, \
        BackendFailed (nothing stays changed, no session starts).
        """,
        "EndSession": """
        Ends the session: every key it wrote returns to its value from before the session (a key that \
        was unset is unset again), every denied restriction returns to allow, the sleep inhibitor is \
        released and the programs the service started stop. By the owner, a caller taking over, or an \
        operator ([Operators] or polkit's org.guidedaccess.GuidedAccess1.end-session). Errors: \
        NotInSession, NotAuthorized, BackendFailed (the session stays active and a retry is possible).
        """,
        "ConfigureForSession": """
        Turns the named features on or off in the session, like UIAccessibility's \
        configureForGuidedAccess(features:enabled:). Owner (or a caller taking over) only. All or \
        nothing; turning on a feature that is on, or off one that is off, changes nothing; turning off \
        an unsupported feature succeeds. Returns once the feature is delivered (a screen reader once \
        it has been started). Features: screen-reader, zoom, invert-colors, grayscale, high-contrast, \
        large-text, on-screen-keyboard, reduce-motion. Errors: InvalidArgs (an empty list, a feature \
        named twice), \
        UnknownFeature, UnsupportedFeature (turning on only), NotInSession, NotAuthorized, BackendFailed.
        """,
        "RegisterRestrictions": """
        Registers custom restrictions as (identifier, text, detail), inside or outside a session; \
        clients only. Identifier: 1 to 255 characters of [A-Za-z0-9._-]; text: 1 to 200 bytes; \
        detail: 0 to 1000 bytes. Registering an identifier again updates its texts and keeps its \
        state. The whole batch or none of it; at most 256 restrictions exist at once; they outlive \
        their client and restarts of the service. Errors: InvalidArgs (also an empty list or a \
        duplicate identifier), NotAuthorized, LimitExceeded.
        """,
        "UnregisterRestrictions": """
        Removes restrictions; clients only; the whole batch or nothing; no signal for a removed \
        restriction. Errors: InvalidArgs (an empty list, an identifier named twice, more than 256), \
        UnknownRestriction, NotAuthorized.
        """,
        "SetRestrictionState": """
        Sets a restriction to allow or deny for the rest of the session; operators only ([Operators] or \
        polkit's org.guidedaccess.GuidedAccess1.manage-restrictions), inside a session only. Emits \
        RestrictionChanged when the state changes. Errors: InvalidArgs (a state other than allow or \
        deny), UnknownRestriction, NotAuthorized, NotInSession.
        """,
        "GetRestrictionState": """
        A restriction's state, allow or deny; allow outside a session. Anyone may call it. Errors: \
        UnknownRestriction.
        """,
        "ListRestrictions": """
        Every registered restriction as (identifier, text, detail, state), sorted by identifier. \
        Anyone may call it.
        """,
        "RegisterAgent": """
        (1.2) Makes the caller's connection the session agent of a system-mode service \
        (guidedaccessd --agent, run as the kiosk user in its graphical session), which has exported \
        org.guidedaccess.Agent1 at /org/guidedaccess/Agent: right after the reply the service reads its \
        properties and calls Apply with the current state. Admitted: the users of [Agent] AllowUsers=, \
        else the user of logind's active session on seat0; never root. The same user's agent takes over \
        from its earlier one; another admitted user's replaces it, and the earlier one is sent Release(). \
        Errors: org.freedesktop.DBus.Error.NotSupported (user mode, where the service is its own agent), \
        NotAuthorized, BackendFailed.
        """,
        "AttachBrowser": """
        (1.2) Attaches a kiosk browser: browser is one end of a socketpair(AF_UNIX, SOCK_STREAM) whose \
        other end relays the browser's --remote-debugging-pipe (NUL-delimited DevTools messages), as \
        guidedaccessctl browser does. The service asks the browser Browser.getVersion (2 s) before it \
        replies; from then on it shows the session's features in the browser's pages, and Desktop ends in \
        +browser, until the socket closes. One attachment per connection (attaching again replaces it), \
        8 at most. Admitted as StartSession's callers are. In system mode it is passed on to the session \
        agent. Errors: InvalidArgs (not a connected Unix stream socket, or its other end is another \
        user's; no DevTools answer), LimitExceeded, NotAuthorized (also: system mode, and the caller is \
        not the session agent's user), org.freedesktop.DBus.Error.NotSupported (system mode without a \
        session agent).
        """,
        "PageCall": """
        (1.2, system mode; the registered session agent only) A call of window.guidedAccess in a page of \
        a browser the agent drives, handed on as JSON {launcher, tab, origin, method, args}; the answer is \
        the call's value as JSON, or its error. The origin must be in the service's own [Browser] \
        AllowOrigins and the launcher one that attached a browser to this service (or the agent itself, \
        for its DevToolsEndpoint): the page then calls as that launcher with its origin and tab, as in \
        user mode. Errors: NotAuthorized (not the agent; an origin or launcher the service does not \
        know), InvalidArgs, and the errors of the method the page called.
        """,
        "PageLeft": """
        (1.2, system mode; the registered session agent only) A page that may own the session is gone: \
        tab closed (origin empty) or went to origin; tab empty: the launcher's browser went.
        """,
        "SessionActive": "Whether a session is active.",
        "SessionOwner": """
        The session owner's unique bus name; empty when there is no session or the owner has left the bus. \
        (1.2) For a session a page started (the page API), the unique name of the launcher that attached \
        its browser (the service's own for DevToolsEndpoint); empty also once the owning tab is gone.
        """,
        "SessionOwnerOrigin": """
        (1.2) The origin of the page whose tab owns the session (page API, [Browser] AllowOrigins); \
        empty for a bus owner, outside a session and while the owner is gone.
        """,
        "SessionDeadline": """
        When the session's time limit ends it, in microseconds since the Unix epoch; 0 = no time limit.
        """,
        "EnabledFeatures": "The features on in this session, sorted; empty outside a session.",
        "SupportedFeatures": """
        The features this service can make real now for the person at the kiosk: on the detected \
        desktop, through the browser layer, or by starting a program it needs (in system mode, through \
        the session agent); sorted. A feature whose setting exists but that nothing on this kiosk would \
        act on is not listed.
        """,
        "UnsupportedReasons": """
        (An addition beyond API 1.2) For each feature not in SupportedFeatures, why: the message of the \
        UnsupportedFeature error a call asking for it gets now (zoom → "zoom: the desktop 'sway' does not \
        act on it (gnome-shell and gnome-kiosk do)"). It changes with SupportedFeatures, in the same PropertiesChanged.
        """,
        "Desktop": """
        The graphical session the features act on, as the service found it (gnome-shell, sway, x11, \
        none and the others docs/settings-mapping.md lists), followed by +name for each layer over it \
        while it is there (+browser: the browser layer is connected). In system mode with a session \
        agent, the agent's.
        """,
        "Agent": """
        (1.2) The user name of the registered session agent, set once the service has read what it \
        delivers (with SupportedFeatures and Desktop, in one PropertiesChanged); empty when none is \
        registered, and always in user mode, where the service is its own agent.
        """,
        "Backend": "The settings backend: gsettings, dconf or memory.",
        "Version": "The service's version.",
        "SessionChanged": """
        A session started or ended. reason: started, resumed (a take-over), ended, time-limit or \
        ended-by-operator. At a start it follows PropertiesChanged; at an end it follows the \
        RestrictionChanged signals and PropertiesChanged. A method's signals are all sent before its reply.
        """,
        "RestrictionChanged": "A restriction's state changed: identifier, and allow or deny.",
    ]
}
