"""Attaches the output of gnome-shell, the buses and guidedaccessd to the
report of a failed desktop test."""

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    desktop = getattr(item, "desktop", None)
    if report.failed and desktop is not None:
        try:
            for title, text in desktop.logs():
                report.sections.append((title, text[-6000:] or "(empty)"))
        except Exception as error:  # a courtesy; never mask the failure
            report.sections.append(("desktop logs", f"cannot read the logs: {error}"))
