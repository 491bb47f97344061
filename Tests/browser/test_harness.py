"""The browser suite's harness checked against real Chromium, without the
service: the screenshots see the kiosk page as it is laid out, and what a
DevTools session of the test's own does to the page (the changes the
browser layer makes, done by hand) moves the measurements as the service
tests expect — so a service test that passes measured the feature, and one
that fails did not fail for the harness's sake."""

import json
import time

import pytest

import images
from chromium import Page
from conftest import PAGE_URL
from images import ANIMATED, BOX, STILL
from looks import TEXT_SCALE, ZOOM, measure_before, shows, wait_until_as_before

INVERT = "html { filter: invert(1) !important }"
ZOOM_2 = "html { zoom: 2 !important }"
TEXT_150 = "html { font-size: 150% !important }"


def adopt(page, css):
    """What the browser layer does: a constructed style sheet in
    document.adoptedStyleSheets (css None: takes it off again)."""
    page.evaluate(
        "(() => { const key = Symbol.for('ga-test'); const css = " + json.dumps(css) + "; "
        "const sheets = document.adoptedStyleSheets.filter((s) => s !== document[key]); "
        "if (css === null) { delete document[key]; } "
        "else { const s = new CSSStyleSheet(); s.replaceSync(css); document[key] = s; sheets.push(s); } "
        "document.adoptedStyleSheets = sheets; })()")


def by_hand(page, features, zoom=ZOOM, text_scale=TEXT_SCALE):
    """The browser layer's changes for `features` (its contract), made by
    this session of the test's own."""
    declarations = []
    if "invert-colors" in features:
        declarations.append("filter: invert(1) !important")
    if "zoom" in features:
        declarations.append(f"zoom: {zoom} !important")
    if "large-text" in features:
        declarations.append(f"font-size: {text_scale * 100}% !important")
    adopt(page, "html { " + "; ".join(declarations) + " }" if declarations else None)
    page.call("Emulation.setEmulatedVisionDeficiency", type="achromatopsia" if "grayscale" in features else "none")
    media = []
    if "high-contrast" in features:
        media += [{"name": "prefers-contrast", "value": "more"}, {"name": "forced-colors", "value": "active"}]
    if "reduce-motion" in features:
        media.append({"name": "prefers-reduced-motion", "value": "reduce"})
    page.call("Emulation.setEmulatedMedia", features=media)


def test_the_screenshots_see_the_kiosk_page_as_laid_out(browser, tmp_path):
    page = browser.page()
    shot = page.screenshot(tmp_path / "page.png")
    assert images.size(shot) == (1280, 800)
    assert images.colour_at(shot, 160, 100) == "#e53935"  # the red block
    assert images.colour_at(shot, 1120, 100) == "#fdd835"  # the yellow block
    assert images.colour_at(shot, 160, 580) == "#1a237e"  # the navy block
    assert images.colour_at(shot, 700, 400) == "#ffffff"
    assert images.colour_box(shot) == BOX, "the 200x100 box is not where the page puts it"
    assert page.rect("#box") == {"x": 40, "y": 240, "width": 200, "height": 100}
    ink = images.ink_box(shot)
    assert ink is not None and 8 <= ink[3] <= 16, f"the default-size text's ink: {ink}"
    assert page.font_size("#text") == 16.0
    assert page.media() == dict.fromkeys(page.media(), False)
    lightness, saturation = images.lightness(shot), images.saturation(shot)
    print(f"\nthe page: mean lightness {lightness:.3f}, mean saturation {saturation:.3f}, text ink {ink}")
    assert 0.5 < lightness < 0.7 and saturation > 0.4


def test_the_animation_moves_only_in_its_strip(browser, tmp_path):
    page = browser.page()
    first = page.screenshot(tmp_path / "first.png")
    time.sleep(0.3)
    second = page.screenshot(tmp_path / "second.png")
    assert images.changed_pixels(first, second, ANIMATED) > 1000, "the animated square did not move"
    assert images.changed_pixels(first, second, STILL) == 0


def test_an_inverting_style_sheet_gives_one_minus_the_lightness_and_taking_it_off_gives_the_page_back(
        browser, tmp_path):
    page = browser.page()
    before = page.screenshot(tmp_path / "before.png")
    adopt(page, INVERT)
    inverted = page.screenshot(tmp_path / "inverted.png")
    adopt(page, None)
    after = page.screenshot(tmp_path / "after.png")
    l_before, l_inverted = images.lightness(before), images.lightness(inverted)
    print(f"\nown invert(1): mean lightness {l_before:.4f} -> {l_inverted:.4f} (1 - L = {1 - l_before:.4f}); "
          f"taken off: {images.changed_pixels(before, after)} pixels differ")
    assert abs(l_inverted - (1 - l_before)) < 0.005
    assert images.colour_at(inverted, 160, 100) == "#1ac6ca"  # 255 - #e53935
    assert page.evaluate("document.querySelectorAll('style').length") == 1, "the sheet must not be a DOM node"
    assert images.changed_pixels(before, after) == 0


def test_css_zoom_on_the_root_magnifies_the_box_in_pixels(browser, tmp_path):
    page = browser.page()
    before = page.screenshot(tmp_path / "before.png")
    adopt(page, ZOOM_2)
    zoomed = page.screenshot(tmp_path / "zoomed.png")
    rect = page.rect("#box")
    print(f"\nown zoom 2: the box in pixels {images.colour_box(before)} -> {images.colour_box(zoomed)}; "
          f"getBoundingClientRect {rect}; innerWidth {page.evaluate('innerWidth')}")
    assert images.colour_box(zoomed) == (80, 480, 400, 200)
    adopt(page, None)
    assert images.changed_pixels(before, page.screenshot(tmp_path / "after.png")) == 0


def test_a_root_font_size_of_150_percent_makes_default_text_24px(browser, tmp_path):
    page = browser.page()
    before = page.screenshot(tmp_path / "before.png")
    adopt(page, TEXT_150)
    large = page.screenshot(tmp_path / "large.png")
    small_ink, large_ink = images.ink_box(before), images.ink_box(large)
    print(f"\nown font-size 150%: #text {page.font_size('#text')} px; ink {small_ink} -> {large_ink} "
          f"(x{large_ink[2] / small_ink[2]:.3f} wide)")
    assert page.font_size("#text") == 24.0
    assert 1.4 < large_ink[2] / small_ink[2] < 1.6
    assert images.colour_box(large) == BOX, "text size must not move the box"


def test_achromatopsia_takes_the_saturation_and_goes_with_the_session_that_set_it(browser, tmp_path):
    page = browser.page()
    before = page.screenshot(tmp_path / "before.png")
    other = browser.page()
    other.call("Emulation.setEmulatedVisionDeficiency", type="achromatopsia")
    grey = page.screenshot(tmp_path / "grey.png")
    print(f"\nown achromatopsia: mean saturation {images.saturation(before):.4f} -> {images.saturation(grey):.4f}, "
          f"lightness {images.lightness(before):.4f} -> {images.lightness(grey):.4f}")
    assert images.saturation(grey) < 0.01
    other.close()
    deadline = time.monotonic() + 2
    while images.changed_pixels(before, page.screenshot(tmp_path / "after.png")) != 0:
        assert time.monotonic() < deadline, "the emulation stayed after its session closed"
        time.sleep(0.1)


def test_emulated_media_is_seen_from_another_session_and_goes_with_the_one_that_set_it(browser):
    page = browser.page()
    other = browser.page()
    other.call("Emulation.setEmulatedMedia", features=[
        {"name": "prefers-contrast", "value": "more"}, {"name": "forced-colors", "value": "active"},
        {"name": "prefers-reduced-motion", "value": "reduce"}])
    assert page.media() == dict.fromkeys(page.media(), True)
    other.close()
    deadline = time.monotonic() + 2
    while any(page.media().values()):
        assert time.monotonic() < deadline, f"still emulated after the session closed: {page.media()}"
        time.sleep(0.05)


def test_a_tab_opened_through_the_endpoint_shows_the_same_page(browser, tmp_path):
    first = browser.page()
    tab = browser.new_tab(PAGE_URL + "?tab")
    assert len(browser.pages()) == 2
    assert images.changed_pixels(first.screenshot(tmp_path / "first.png"), tab.screenshot(tmp_path / "tab.png")) == 0


def test_chromium_killed_and_started_again_on_the_same_port_and_profile(browser, tmp_path):
    first_run = set(browser.processes())
    assert len(first_run) > 3, f"expected Chromium's process tree, found {first_run}"
    page = browser.page()
    adopt(page, INVERT)
    seconds = browser.restart()
    assert not first_run & set(browser.processes()), "processes of the killed browser survived"
    assert [p["url"] for p in browser.pages()] == [PAGE_URL]
    shot = browser.page().screenshot(tmp_path / "again.png")
    print(f"\nendpoint back {seconds:.2f} s after kill -9; page lightness {images.lightness(shot):.3f}")
    assert images.colour_at(shot, 160, 100) == "#e53935", "the restarted browser's page is not the fresh page"


def test_a_style_sheet_adopted_from_a_new_document_script_styles_pages_loaded_later(browser, tmp_path):
    """What the browser layer relies on for pages navigated to during a
    session: a script registered with Page.addScriptToEvaluateOnNewDocument
    (after Page.enable) can adopt a constructed sheet before the page's own
    content is parsed, and a reload keeps running it."""
    page = browser.page()
    before = page.screenshot(tmp_path / "before.png")
    own = Page(browser.pages()[0]["webSocketDebuggerUrl"])
    try:
        own.call("Page.enable")
        own.call("Page.addScriptToEvaluateOnNewDocument", source=(
            "(() => { const s = new CSSStyleSheet(); s.replaceSync('html { filter: invert(1) !important }'); "
            "document.adoptedStyleSheets = [...document.adoptedStyleSheets, s]; })()"))
        page.navigate(PAGE_URL + "?next")
        shot = page.screenshot(tmp_path / "navigated.png")
        assert abs(images.lightness(shot) - (1 - images.lightness(before))) < 0.005
        assert page.evaluate("document.adoptedStyleSheets.length") == 1
    finally:
        own.close()


def test_the_picture_helper_puts_the_steps_side_by_side(browser, tmp_path):
    page = browser.page()
    before = page.screenshot(tmp_path / "before.png")
    adopt(page, INVERT)
    inverted = page.screenshot(tmp_path / "inverted.png")
    picture = images.write_picture([("before", before), ("inverted", inverted)], tmp_path / "picture.png")
    width, height = images.size(picture)
    assert 2 * 320 <= width <= 2 * 340 and 200 <= height <= 260, (width, height)


# ---------------------------------------------------------------- the service tests' measurements (looks.py)

FEATURES = ["grayscale", "high-contrast", "invert-colors", "large-text", "reduce-motion", "zoom"]
TOGETHER = ["grayscale", "invert-colors", "large-text", "reduce-motion", "zoom"]


@pytest.mark.parametrize("feature", FEATURES)
def test_each_feature_made_by_hand_is_measured_as_shown_and_undoing_it_as_before(browser, tmp_path, feature):
    page, own = browser.page(), browser.page()
    before = measure_before(page, tmp_path / "before.png")
    ok, what = shows(feature, page, before.shot, before, alone=True)
    assert not ok, f"the pristine page is measured as showing {feature}: {what}"
    by_hand(own, [feature])
    ok, what = shows(feature, page, page.screenshot(tmp_path / "on.png"), before, alone=True)
    print(f"\n{feature} by hand: {what}")
    assert ok, f"{feature} made by hand is not measured as shown: {what}"
    by_hand(own, [])
    wait_until_as_before(page, before, tmp_path / "off.png", timeout=0.5)


def test_the_features_together_are_each_measured_and_none_is_mistaken_for_another(browser, tmp_path):
    page, own = browser.page(), browser.page()
    before = measure_before(page, tmp_path / "before.png")
    by_hand(own, TOGETHER)
    shot = page.screenshot(tmp_path / "together.png")
    measured = {f: shows(f, page, shot, before, alone=False) for f in TOGETHER}
    print(f"\ntogether by hand: {measured}")
    assert all(ok for ok, _ in measured.values()), measured
    for missing in TOGETHER:
        by_hand(own, [f for f in TOGETHER if f != missing])
        shot = page.screenshot(tmp_path / f"without-{missing}.png")
        measured = {f: shows(f, page, shot, before, alone=False)[0] for f in TOGETHER}
        assert measured == {f: f != missing for f in TOGETHER}, f"without {missing}: {measured}"
    by_hand(own, [])
    wait_until_as_before(page, before, tmp_path / "off.png", timeout=0.5)


def test_other_factors_made_by_hand_are_measured_with_them_and_not_with_the_defaults(browser, tmp_path):
    page, own = browser.page(), browser.page()
    before = measure_before(page, tmp_path / "before.png")
    for feature in ("zoom", "large-text"):
        by_hand(own, [feature], zoom=1.5, text_scale=1.25)
        shot = page.screenshot(tmp_path / f"{feature}.png")
        ok, what = shows(feature, page, shot, before, alone=True, zoom=1.5, text_scale=1.25)
        print(f"\n{feature} by hand at zoom 1.5, text 1.25: {what}")
        assert ok, what
        ok, what = shows(feature, page, shot, before, alone=True)
        assert not ok, f"{feature} at 1.5/1.25 is measured as the default factors: {what}"
    by_hand(own, [])
    wait_until_as_before(page, before, tmp_path / "off.png", timeout=0.5)
