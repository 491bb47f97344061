#ifndef GUIDEDACCESS_CDCONF_SHIM_H
#define GUIDEDACCESS_CDCONF_SHIM_H
// libdconf's client: one change set for keys of several schemas, written by
// dconf-service in one database write.
#include <dconf.h>
#endif
