// Placeholder so the manifest resolves on branch `glib`, where the DBus
// module's sources are not present yet. Delete when the DBus module lands.
