// Placeholder so the manifest resolves on branch `glib`, where the DBus
// tests are not present yet. Delete when the DBus module lands.
