# Build and install guidedaccessd with its systemd, D-Bus and polkit files.
#   make                       release build (Swift standard library linked statically)
#   make build PRODUCT=NAME    another product built the same way (the benchmarks' helpers)
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
DBUSINTERFACESDIR ?= $(DATADIR)/dbus-1/interfaces
POLKITACTIONDIR ?= $(DATADIR)/polkit-1/actions

# The binary to install; check-system-files may be pointed at a debug build.
GUIDEDACCESSD ?= .build/release/guidedaccessd

SUBST = sed -e 's|@libexecdir@|$(LIBEXECDIR)|g'

.PHONY: all build install check-system-files
all: build

# The release build as it ships, and the one the benchmarks measure
# (scripts/lib.sh release_build): the Swift standard library linked in, and
# every module compiled without the implicit import of _StringProcessing
# (Regex and the String algorithms on it), so none can use it: one
# `text.contains("ab")` would link all of it into the static binary, 1.2 MB
# more text. On the command line, not in Package.swift: SwiftPM refuses a
# dependency by version (a kiosk app on GuidedAccessClient) whose targets have
# unsafeFlags. A plain `swift build` compiles the same sources without it.
#
# Linked for a small resident set (each measured with scripts/bench-service's
# method; PIE, RELRO and ASLR are kept):
#   -function-sections     each function in a section of its own, so that
#                          --gc-sections (SwiftPM's) drops the unused ones;
#   -use-ld=lld            the toolchain's lld (ld.lld beside swiftc) instead
#                          of gold, for what follows;
#   -z pack-relative-relocs  RELR: the ~24,000 relative relocations of a PIE
#                          in 4 KB instead of a 563 KB .rela.dyn that the
#                          loader reads in at every start (needs glibc 2.36:
#                          Debian 12; the binary says so in its version needs);
#   --no-export-dynamic    no dynamic symbol table of every Swift symbol
#                          (static-stdlib-args.lnk asks for -export-dynamic;
#                          nothing looks the executable's symbols up, and the
#                          Swift backtracer reads .symtab and DWARF).
# SwiftPM does not recompile a module for changed -Xfrontend flags: objects
# compiled before keep one section per file until they are rebuilt.
SWIFT_RELEASE_BUILD = swift build -c release --static-swift-stdlib \
    -Xswiftc -Xfrontend -Xswiftc -disable-implicit-string-processing-module-import \
    -Xswiftc -Xfrontend -Xswiftc -function-sections \
    -Xswiftc -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs -Xlinker --no-export-dynamic
PRODUCT = guidedaccessd

build:
	$(SWIFT_RELEASE_BUILD) --product $(PRODUCT)

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
	install -D -m 0644 docs/org.guidedaccess.GuidedAccess1.xml $(DESTDIR)$(DBUSINTERFACESDIR)/org.guidedaccess.GuidedAccess1.xml
	install -m 0644 systemd/guidedaccess.conf.example $(DESTDIR)$(DOCDIR)/examples/guidedaccess.conf
	install -D -m 0755 systemd/guidedaccess-dconf-profile $(DESTDIR)$(PREFIX)/sbin/guidedaccess-dconf-profile
	install -m 0644 README.md $(DESTDIR)$(DOCDIR)/README.md

check-system-files: $(GUIDEDACCESSD)
	GUIDEDACCESSD=$(GUIDEDACCESSD) scripts/check-system-files
