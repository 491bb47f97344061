/* The memory floor of the C libraries guidedaccessd links (libdbus, GLib,
 * GIO, libdconf) and what they pull in: a C program that links them, calls
 * nothing of them, prints one line and waits. scripts/bench-service measures
 * its VmRSS beside guidedaccessd's. */
#include <dbus/dbus.h>
#include <dconf.h>
#include <gio/gio.h>
#include <stdio.h>
#include <unistd.h>

/* Referenced, so that --as-needed keeps every library loaded. */
void *volatile keep[] = {
    (void *) dbus_get_version, (void *) g_key_file_new, (void *) g_settings_schema_source_get_default,
    (void *) dconf_client_new,
};

int main(void) {
    puts("ready");
    fflush(stdout);
    for (;;) pause();
}
