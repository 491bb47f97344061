"""What a page of the kiosk shows, measured: whether each feature is on
(as the browser layer's contract describes it, on pages/kiosk.html) and
whether a page is as it was before the service touched it.

- zoom (factor 2): the 200x100 box at (40, 240) is 400x200 pixels at
  (80, 480) (factor f: 200f x 100f at (40f, 240f));
- invert-colors: mean lightness 1 - before; white is black;
- grayscale: mean saturation ~0;
- large-text (1.5): default-size text is 24 px (its ink 1.5x as wide);
  (scale s: 16s px);
- high-contrast: matchMedia (prefers-contrast: more) and (forced-colors:
  active), and forced colours rendered (the page's own colours gone);
- reduce-motion: matchMedia (prefers-reduced-motion: reduce);
- as before: pixel for pixel (`compare -metric AE` = 0, the animated strip
  left out), no query matching, no adopted style sheet.

Alone, a feature is measured on the whole page; together with others, on
what the others leave measurable (white stays white under zoom and
grayscale, the box stays one colour under invert and grayscale)."""

import time
from dataclasses import dataclass
from pathlib import Path

import images

ZOOM = 2.0
TEXT_SCALE = 1.5
WHITE_POINT = (1000, 430)  # white in the page at zoom 1 and 2, never text
SHOW_TIMEOUT = 2.0  # ConfigureForSession replies once the pages have been told
MEDIA_OFF = {"(prefers-contrast: more)": False, "(forced-colors: active)": False,
             "(prefers-reduced-motion: reduce)": False}


@dataclass
class Before:
    """A page measured before the service touched it."""
    shot: Path
    lightness: float
    saturation: float
    ink: tuple


def measure_before(page, path):
    shot = page.screenshot(path)
    assert page.media() == MEDIA_OFF and page.font_size("#text") == 16.0, "the page is not pristine"
    return Before(shot, images.lightness(shot), images.saturation(shot), images.ink_box(shot))


def zoomed(region, factor):
    return tuple(round(v * factor) for v in region)


def zoomed_box(shot, factor=ZOOM):
    """Where the box is if the page is zoomed by `factor`: the pixels
    around the zoomed box's centre that have its colour (whatever invert
    and grayscale made of it), in a window 20 px wider than the zoomed box
    each way, which is white in the page. Unzoomed (or zoomed otherwise),
    the colour there is another block's or white, which fills more."""
    x, y, w, h = zoomed(images.BOX, factor)
    colour = images.colour_at(shot, x + w // 2, y + h // 2)
    return images.colour_box(shot, colour, region=(x - 20, y - 20, w + 40, h + 40), fuzz="2%")


def shows(feature, page, shot, before, alone, zoom=ZOOM, text_scale=TEXT_SCALE):
    """(whether the page shows `feature`, what was measured). `alone`: no
    other feature is on, so the stricter whole-page measurements apply."""
    if feature == "invert-colors":
        white = images.colour_at(shot, *WHITE_POINT)
        if not alone:
            return white == "#000000", f"page white is {white}"
        lightness = images.lightness(shot)
        return (white == "#000000" and abs(lightness - (1 - before.lightness)) < 0.01,
                f"mean lightness {before.lightness:.3f} -> {lightness:.3f} (1 - L = {1 - before.lightness:.3f}), "
                f"page white is {white}")
    if feature == "grayscale":
        saturation = images.saturation(shot)
        return saturation < 0.02, f"mean saturation {before.saturation:.3f} -> {saturation:.3f}"
    if feature == "zoom":
        box, expected = zoomed_box(shot, zoom), zoomed(images.BOX, zoom)
        ok = box is not None and all(abs(a - b) <= 2 for a, b in zip(box, expected))
        return ok, f"the 200x100 box is {box} in pixels (expected {expected} at zoom {zoom})"
    if feature == "large-text":
        size = page.font_size("#text")
        ok, what = abs(size - 16 * text_scale) < 0.01, f"default-size text is {size} px (expected {16 * text_scale})"
        if alone:
            ink = images.ink_box(shot)
            ratio = ink[2] / before.ink[2] if ink else 0
            ok = ok and abs(ratio - text_scale) < 0.1
            what += f", its ink {before.ink} -> {ink} (x{ratio:.2f} wide)"
        return ok, what
    if feature == "high-contrast":
        media = page.media()
        ok = media["(prefers-contrast: more)"] and media["(forced-colors: active)"]
        what = f"matchMedia {media}"
        if alone:
            saturation, box = images.saturation(shot), images.colour_box(shot)
            ok = ok and saturation < 0.02 and box is None
            what += f", mean saturation {saturation:.3f}, the magenta box at {box} (forced colours: gone)"
        return ok, what
    if feature == "reduce-motion":
        media = page.media()
        return media["(prefers-reduced-motion: reduce)"], f"matchMedia {media}"
    raise ValueError(feature)


def wait_for_look(page, path, check, what, timeout):
    """Screenshots until check(shot) gives (True, _); returns (shot, the
    number of screenshots before it did). Fails naming the last measurement."""
    begun = time.monotonic()
    tries = 0
    while True:
        shot = page.screenshot(path)
        ok, measured = check(shot)
        if ok:
            return shot, tries
        tries += 1
        if time.monotonic() - begun > timeout:
            raise AssertionError(f"{what}: not after {timeout} s: {measured}")
        time.sleep(0.1)


def wait_until_shows(page, before, features, path, timeout=SHOW_TIMEOUT, label="page"):
    features = sorted(features)

    def check(shot):
        results = {f: shows(f, page, shot, before, alone=len(features) == 1) for f in features}
        return all(ok for ok, _ in results.values()), "; ".join(
            f"{f}: {'ok' if ok else 'MISSING'} ({what})" for f, (ok, what) in results.items())

    return wait_for_look(page, path, check, f"{label} does not show {', '.join(features)}", timeout)


def wait_until_as_before(page, before, path, timeout=SHOW_TIMEOUT, label="page"):
    def check(shot):
        changed = images.changed_pixels(before.shot, shot)
        media = page.media()
        sheets = page.evaluate("document.adoptedStyleSheets.length")
        return changed == 0 and media == MEDIA_OFF and sheets == 0, (
            f"{changed} pixels differ from before (compare -metric AE, animation left out), matchMedia {media}, "
            f"{sheets} adopted style sheets")

    return wait_for_look(page, path, check, f"{label} is not as before", timeout)
