"""Measuring screenshots of the kiosk page (pages/kiosk.html, 1280x800)
with ImageMagick from /usr/bin: mean HSL lightness and saturation, pixels
changed (`compare -metric AE`), where a colour is (zoom), where the text's
ink is (large text), and the side-by-side picture of the README.

Regions are (x, y, width, height) in screenshot pixels. Everything is
measured on STILL, the page without its animated strip (y >= 720), unless a
region is given."""

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent / "desktop"))
from gnomeshell import crop, magick  # noqa: E402

TOOLS = {name: f"/usr/bin/{name}" for name in ("convert", "compare", "identify", "montage")}

WIDTH, HEIGHT = 1280, 800
ANIMATED = (0, 720, 1280, 80)  # the strip with the moving square
STILL = (0, 0, 1280, 710)  # the rest, with a margin of 10 px
TEXT_AREA = (300, 220, 980, 220)  # white but for #text, in any text size up to 3x
BOX = (40, 240, 200, 100)  # #box in CSS px, as laid out at zoom 1
BOX_COLOUR = "#ff00ff"


def missing():
    return [path for path in TOOLS.values() if not Path(path).exists()]


def size(path):
    width, height = magick("identify", "-format", "%w %h", path).stdout.split()
    return int(width), int(height)


def fx(path, expression, region, *operations):
    done = magick("convert", path, *crop(region), *operations, "-format", f"%[fx:{expression}]", "info:")
    return float(done.stdout.strip())


def lightness(path, region=STILL):
    """Mean HSL lightness, 0…1."""
    return fx(path, "mean", region, "-colorspace", "HSL", "-channel", "B", "-separate")


def saturation(path, region=STILL):
    """Mean HSL saturation, 0…1."""
    return fx(path, "mean", region, "-colorspace", "HSL", "-channel", "G", "-separate")


def colour_at(path, x, y):
    """The pixel's colour as "#rrggbb" (lower case)."""
    done = magick("convert", path, "-format", f"%[hex:p{{{x},{y}}}]", "info:")
    return "#" + done.stdout.strip().lower()[:6]


def changed_pixels(a, b, region=STILL):
    """How many pixels of `region` differ between two screenshots
    (`compare -metric AE` of both cropped to it, no fuzz: any difference
    counts)."""
    done = magick("convert", a, b, *crop(region), "-metric", "AE", "-compare", "-format", "%[distortion]", "info:")
    return int(float(done.stdout.strip()))


def _bounding_box(path, region, *operations):
    """The bounding box (x, y, w, h) in screenshot pixels of the white
    pixels after `operations` turned the region black and white, or None."""
    done = magick("convert", path, *crop(region), *operations, "-bordercolor", "black", "-border", "1",
                  "-format", "%@", "info:")
    text = done.stdout.strip()  # WxH+X+Y of what is not the border's colour
    size_part, x, y = text.split("+")
    w, h = map(int, size_part.split("x"))
    if w == 0 or h == 0 or (w, h) == (region[2] + 2, region[3] + 2):
        return None
    return region[0] + int(x) - 1, region[1] + int(y) - 1, w, h


def colour_box(path, colour=BOX_COLOUR, region=(0, 0, WIDTH, HEIGHT), fuzz="8%"):
    """Where pixels of `colour` are: (x, y, w, h), or None."""
    return _bounding_box(path, region, "-alpha", "off", "-fuzz", fuzz, "-fill", "black", "+opaque", colour,
                         "-fill", "white", "-opaque", colour)


def ink_box(path, region=TEXT_AREA):
    """Where the dark pixels (text on white) of a region are: (x, y, w, h), or None."""
    return _bounding_box(path, region, "-alpha", "off", "-colorspace", "Gray", "-threshold", "50%", "-negate")


def write_picture(steps, out, width=320):
    """The README's picture: screenshots side by side, each scaled to
    `width` px wide and labelled. steps: [(label, path)]."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args = []
    for label, path in steps:
        args += ["-label", label, path]
    magick("montage", *args, "-tile", f"{len(steps)}x1", "-geometry", f"{width}x+6+6",
           "-font", "DejaVu-Sans", "-pointsize", "16", "-background", "#ffffff", out)
    return out
