#ifndef GUIDEDACCESS_CGIO_SHIM_H
#define GUIDEDACCESS_CGIO_SHIM_H
#include <gio/gio.h>
#endif
