#ifndef GUIDEDACCESS_CLINUX_SHIM_H
#define GUIDEDACCESS_CLINUX_SHIM_H
/* Linux event sources the main loop waits on, and glibc's malloc tuning
   (the daemon's mallopt); not all are in Swift's Glibc module. */
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/signalfd.h>
#include <sys/inotify.h>
#include <signal.h>
#include <malloc.h>
#endif
