"""A Timeline as a PNG: the SVG picture rasterised by cairosvg (the optional ``png`` extra)."""

from __future__ import annotations

from pipeforge.errors import UsageError
from pipeforge.files import write_atomically
from pipeforge.render.svg import render_svg
from pipeforge.sim.simulate import Timeline

INSTALL_HINT = "PNG output needs cairosvg (and the system's libcairo): pip install 'pipeforge[png]'"
MAX_SIDE = 32_767  # cairo's limit on an image surface's side
MAX_PIXELS = 50_000_000  # 200 MB of RGBA


def png_bytes(timeline: Timeline, *, title: str | None = None, scale: float = 2.0) -> bytes:
    """The picture as PNG bytes, drawn at ``scale`` times the SVG's pixel size."""
    svg = render_svg(timeline, title)
    _check_size(svg, scale)
    svg2png = _cairosvg()
    return svg2png(bytestring=svg.encode("utf-8"), scale=scale)


def _check_size(svg: str, scale: float) -> None:
    """Refuse a picture cairo cannot allocate (or that would take gigabytes), before it tries."""
    import re

    size = re.match(r'<svg [^>]*?width="([0-9.]+)" height="([0-9.]+)"', svg)
    if size is None:
        return
    width, height = (round(float(side) * scale) for side in size.groups())
    if max(width, height) > MAX_SIDE or width * height > MAX_PIXELS:
        raise UsageError(f"the picture would be {width} x {height} pixels, too large for a PNG; "
                         f"write .svg or .html instead")


def render_png(timeline: Timeline, path: str, *, title: str | None = None, scale: float = 2.0) -> None:
    """Write the picture to ``path`` as PNG."""
    write_atomically(path, png_bytes(timeline, title=title, scale=scale))


def _cairosvg():
    try:
        from cairosvg import svg2png
    except ImportError as missing:
        raise UsageError(f"{INSTALL_HINT} ({missing})") from None
    except OSError as missing:  # cairocffi installed but libcairo absent
        raise UsageError(f"{INSTALL_HINT}; libcairo could not be loaded ({missing})") from None
    return svg2png
