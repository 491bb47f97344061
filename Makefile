# Build and install guidedaccessd with its systemd, D-Bus and polkit files.
#   make                       release build (Swift standard library linked statically)
#   make install DESTDIR=...   install under PREFIX (default /usr)
#   make check-system-files    validate the system files on a staged install

PREFIX ?= /usr
LIBEXECDIR ?= $(PREFIX)/libexec
DATADIR ?= $(PREFIX)/share
DOCDIR ?= $(DATADIR)/doc/guidedaccess
# Debian 12: /lib/systemd/system and /usr/lib/systemd/user.
SYSTEMDSYSTEMUNITDIR ?= $(or $(shell pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null),/lib/systemd/system)
SYSTEMDUSERUNITDIR ?= $(or $(shell pkg-config --variable=systemduserunitdir systemd 2>/dev/null),/usr/lib/systemd/user)
DBUSSYSTEMSERVICEDIR ?= $(DATADIR)/dbus-1/system-services
DBUSSESSIONSERVICEDIR ?= $(DATADIR)/dbus-1/services
DBUSSYSTEMCONFDIR ?= $(DATADIR)/dbus-1/system.d
POLKITACTIONDIR ?= $(DATADIR)/polkit-1/actions

# The binary to install; check-system-files may be pointed at a debug build.
GUIDEDACCESSD ?= .build/release/guidedaccessd

SUBST = sed -e 's|@libexecdir@|$(LIBEXECDIR)|g'

.PHONY: all build install check-system-files
all: build

build:
	swift build -c release --static-swift-stdlib --product guidedaccessd

.build/release/guidedaccessd: build

install: $(GUIDEDACCESSD)
	install -D -m 0755 $(GUIDEDACCESSD) $(DESTDIR)$(LIBEXECDIR)/guidedaccessd
	install -d $(DESTDIR)$(SYSTEMDSYSTEMUNITDIR) $(DESTDIR)$(SYSTEMDUSERUNITDIR) \
	    $(DESTDIR)$(DBUSSYSTEMSERVICEDIR) $(DESTDIR)$(DBUSSESSIONSERVICEDIR) \
	    $(DESTDIR)$(DBUSSYSTEMCONFDIR) $(DESTDIR)$(POLKITACTIONDIR) $(DESTDIR)$(DOCDIR)/examples
	$(SUBST) systemd/guidedaccessd.service > $(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/guidedaccessd.service
	$(SUBST) systemd/guidedaccessd-user.service > $(DESTDIR)$(SYSTEMDUSERUNITDIR)/guidedaccessd-user.service
	$(SUBST) systemd/org.guidedaccess.GuidedAccess1.service > $(DESTDIR)$(DBUSSYSTEMSERVICEDIR)/org.guidedaccess.GuidedAccess1.service
	$(SUBST) systemd/org.guidedaccess.GuidedAccess1.session.service > $(DESTDIR)$(DBUSSESSIONSERVICEDIR)/org.guidedaccess.GuidedAccess1.service
	chmod 0644 $(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/guidedaccessd.service \
	    $(DESTDIR)$(SYSTEMDUSERUNITDIR)/guidedaccessd-user.service \
	    $(DESTDIR)$(DBUSSYSTEMSERVICEDIR)/org.guidedaccess.GuidedAccess1.service \
	    $(DESTDIR)$(DBUSSESSIONSERVICEDIR)/org.guidedaccess.GuidedAccess1.service
	install -m 0644 systemd/org.guidedaccess.GuidedAccess1.conf $(DESTDIR)$(DBUSSYSTEMCONFDIR)/
	install -m 0644 systemd/org.guidedaccess.GuidedAccess1.policy $(DESTDIR)$(POLKITACTIONDIR)/
	install -m 0644 systemd/guidedaccess.conf.example $(DESTDIR)$(DOCDIR)/examples/guidedaccess.conf
	install -D -m 0755 systemd/guidedaccess-dconf-profile $(DESTDIR)$(PREFIX)/sbin/guidedaccess-dconf-profile
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md

check-system-files: $(GUIDEDACCESSD)
	GUIDEDACCESSD=$(GUIDEDACCESSD) scripts/check-system-files
