# Build and install guidedaccessd with its systemd, D-Bus and polkit files.
#   make                       release build (Swift standard library linked statically),
#                              man pages and shell completions
#   make build                 the release builds of guidedaccessd and guidedaccessctl
#   make build PRODUCT=NAME    another product built the same way (the benchmarks' helpers)
#   make man                   the man pages, rendered with scdoc into .build/man
#   make completions           guidedaccessctl's bash, zsh and fish completions into .build/completions
#   make install DESTDIR=...   install under PREFIX (default /usr)
#   make check-system-files    validate the system files on a staged install
#   make check-docs            lint the man pages, check them against the programs, try the completions

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
BINDIR ?= $(PREFIX)/bin
MANDIR ?= $(DATADIR)/man
# Where each shell looks: bash-completion's and fish's own pkg-config
# variables, and Debian's place for zsh (in zsh's default $fpath).
BASHCOMPLETIONDIR ?= $(or $(shell pkg-config --variable=completionsdir bash-completion 2>/dev/null),$(DATADIR)/bash-completion/completions)
ZSHCOMPLETIONDIR ?= $(DATADIR)/zsh/vendor-completions
FISHCOMPLETIONDIR ?= $(or $(shell pkg-config --variable=completionsdir fish 2>/dev/null),$(DATADIR)/fish/vendor_completions.d)

# The binary to install; check-system-files may be pointed at a debug build.
GUIDEDACCESSD ?= .build/release/guidedaccessd
# The command-line client to install, and to generate the completions with;
# by default the one beside GUIDEDACCESSD, so that pointing GUIDEDACCESSD at
# a debug build points this at the same build.
GUIDEDACCESSCTL ?= $(dir $(GUIDEDACCESSD))guidedaccessctl

SUBST = sed -e 's|@libexecdir@|$(LIBEXECDIR)|g'

.PHONY: all build install check-system-files man completions check-docs \
    install-guidedaccessctl install-man install-completions
all: build man completions

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
#   -z now                 full RELRO (Debian's hardening=+bindnow, which
#                          lintian asks for): the few symbols from libc,
#                          libdbus, GLib and dconf bound at start, the GOT
#                          read-only after; scripts/bench-service showed no
#                          change (VmRSS 13.0 MiB after a session, start to
#                          first reply 13.4 against 14.1 ms without).
# SwiftPM does not recompile a module for changed -Xfrontend flags: objects
# compiled before keep one section per file until they are rebuilt.
SWIFT_RELEASE_BUILD = swift build -c release --static-swift-stdlib \
    -Xswiftc -Xfrontend -Xswiftc -disable-implicit-string-processing-module-import \
    -Xswiftc -Xfrontend -Xswiftc -function-sections \
    -Xswiftc -use-ld=lld -Xlinker -z -Xlinker pack-relative-relocs -Xlinker --no-export-dynamic \
    -Xlinker -z -Xlinker now
# One or more products (swift build takes one --product at a time).
PRODUCT = guidedaccessd guidedaccessctl

build:
	$(foreach product,$(PRODUCT),$(SWIFT_RELEASE_BUILD) --product $(product) &&) true

.build/release/guidedaccessd .build/release/guidedaccessctl: build

install: $(GUIDEDACCESSD)
	install -D -m 0755 $(GUIDEDACCESSD) $(DESTDIR)$(LIBEXECDIR)/guidedaccessd
	install -d $(DESTDIR)$(SYSTEMDSYSTEMUNITDIR) $(DESTDIR)$(SYSTEMDUSERUNITDIR) \
	    $(DESTDIR)$(DBUSSYSTEMSERVICEDIR) $(DESTDIR)$(DBUSSESSIONSERVICEDIR) \
	    $(DESTDIR)$(DBUSSYSTEMCONFDIR) $(DESTDIR)$(POLKITACTIONDIR) $(DESTDIR)$(DOCDIR)/examples
	$(SUBST) systemd/guidedaccessd.service > $(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/guidedaccessd.service
	$(SUBST) systemd/guidedaccessd-user.service > $(DESTDIR)$(SYSTEMDUSERUNITDIR)/guidedaccessd-user.service
	$(SUBST) systemd/guidedaccess-agent.service > $(DESTDIR)$(SYSTEMDUSERUNITDIR)/guidedaccess-agent.service
	$(SUBST) systemd/org.guidedaccess.GuidedAccess1.service > $(DESTDIR)$(DBUSSYSTEMSERVICEDIR)/org.guidedaccess.GuidedAccess1.service
	$(SUBST) systemd/org.guidedaccess.GuidedAccess1.session.service > $(DESTDIR)$(DBUSSESSIONSERVICEDIR)/org.guidedaccess.GuidedAccess1.service
	chmod 0644 $(DESTDIR)$(SYSTEMDSYSTEMUNITDIR)/guidedaccessd.service \
	    $(DESTDIR)$(SYSTEMDUSERUNITDIR)/guidedaccessd-user.service \
	    $(DESTDIR)$(SYSTEMDUSERUNITDIR)/guidedaccess-agent.service \
	    $(DESTDIR)$(DBUSSYSTEMSERVICEDIR)/org.guidedaccess.GuidedAccess1.service \
	    $(DESTDIR)$(DBUSSESSIONSERVICEDIR)/org.guidedaccess.GuidedAccess1.service
	install -m 0644 systemd/org.guidedaccess.GuidedAccess1.conf $(DESTDIR)$(DBUSSYSTEMCONFDIR)/
	install -m 0644 systemd/org.guidedaccess.GuidedAccess1.policy $(DESTDIR)$(POLKITACTIONDIR)/
	install -D -m 0644 docs/org.guidedaccess.GuidedAccess1.xml $(DESTDIR)$(DBUSINTERFACESDIR)/org.guidedaccess.GuidedAccess1.xml
	install -m 0644 docs/org.guidedaccess.Agent1.xml $(DESTDIR)$(DBUSINTERFACESDIR)/org.guidedaccess.Agent1.xml
	install -m 0644 systemd/guidedaccess.conf.example $(DESTDIR)$(DOCDIR)/examples/guidedaccess.conf
	install -D -m 0755 systemd/guidedaccess-dconf-profile $(DESTDIR)$(PREFIX)/sbin/guidedaccess-dconf-profile
	install -m 0644 README.md docs/dbus-api.md docs/settings-mapping.md docs/fleet.md $(DESTDIR)$(DOCDIR)/

check-system-files: $(GUIDEDACCESSD) $(GUIDEDACCESSCTL)
	GUIDEDACCESSD=$(GUIDEDACCESSD) GUIDEDACCESSCTL=$(GUIDEDACCESSCTL) scripts/check-system-files

# guidedaccessctl, the man pages and the completions: build output under
# .build (git-ignored), rendered and generated here rather than committed.
# Compressing the pages is left to packaging (dh_installman, dh_compress).
# Every docs/man/NAME.SECTION.scd; its section from the name.
MANPAGES = $(patsubst docs/man/%.scd,.build/man/%,$(wildcard docs/man/*.scd))
COMPLETIONS = .build/completions/guidedaccessctl.bash .build/completions/_guidedaccessctl \
    .build/completions/guidedaccessctl.fish

man: $(MANPAGES)

.build/man/%: docs/man/%.scd
	@mkdir -p .build/man
	scdoc < $< > $@.tmp
	mv $@.tmp $@

# swift-argument-parser writes them from the command's own definition.
# bash-completion sources its files: the bash script's #! line goes.
completions: $(COMPLETIONS)

.build/completions/guidedaccessctl.bash: $(GUIDEDACCESSCTL)
	@mkdir -p .build/completions
	$(GUIDEDACCESSCTL) --generate-completion-script bash > $@.tmp
	sed -i '1{/^#!/d}' $@.tmp
	mv $@.tmp $@

.build/completions/_guidedaccessctl: $(GUIDEDACCESSCTL)
	@mkdir -p .build/completions
	$(GUIDEDACCESSCTL) --generate-completion-script zsh > $@.tmp
	mv $@.tmp $@

.build/completions/guidedaccessctl.fish: $(GUIDEDACCESSCTL)
	@mkdir -p .build/completions
	$(GUIDEDACCESSCTL) --generate-completion-script fish > $@.tmp
	mv $@.tmp $@

install: install-guidedaccessctl install-man install-completions

install-guidedaccessctl: $(GUIDEDACCESSCTL)
	install -D -m 0755 $(GUIDEDACCESSCTL) $(DESTDIR)$(BINDIR)/guidedaccessctl

install-man: $(MANPAGES)
	for page in $(MANPAGES); do \
	    install -D -m 0644 $$page $(DESTDIR)$(MANDIR)/man$${page##*.}/$${page##*/} || exit 1; \
	done

install-completions: $(COMPLETIONS)
	install -D -m 0644 .build/completions/guidedaccessctl.bash $(DESTDIR)$(BASHCOMPLETIONDIR)/guidedaccessctl
	install -D -m 0644 .build/completions/_guidedaccessctl $(DESTDIR)$(ZSHCOMPLETIONDIR)/_guidedaccessctl
	install -D -m 0644 .build/completions/guidedaccessctl.fish $(DESTDIR)$(FISHCOMPLETIONDIR)/guidedaccessctl.fish

check-docs: $(GUIDEDACCESSD) $(GUIDEDACCESSCTL) $(MANPAGES) $(COMPLETIONS)
	GUIDEDACCESSD=$(GUIDEDACCESSD) GUIDEDACCESSCTL=$(GUIDEDACCESSCTL) scripts/check-docs
