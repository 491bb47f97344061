/// (1.2) `AttachBrowser`: the kiosk browser's DevTools pipe, relayed by its
/// launcher (`guidedaccessctl browser`) over a Unix socket whose other end
/// the launcher hands the service. The driver of the browser's pages
/// implements it; the service admits the caller and passes the socket on.
package protocol BrowserAttaching: AnyObject {
    /// Takes `descriptor` (the implementation owns it from here, whatever
    /// happens), attached by `caller`; replaces an earlier attachment of
    /// the same connection. Returns the browser's name and version once it
    /// has answered, or throws why it is not taken (`.invalidArgs`: not a
    /// Unix stream socket, or no DevTools at its other end;
    /// `.limitExceeded`: too many browsers attached).
    nonisolated(nonsending) func attach(_ caller: BusCaller, descriptor: Int32) async throws(GuidedAccessError) -> String
}
