"""A Timeline as a PNG: the SVG picture rasterised by cairosvg (the optional ``png`` extra)."""

from __future__ import annotations

from pipeforge.errors import UsageError
from pipeforge.render.svg import render_svg
from pipeforge.sim.simulate import Timeline

INSTALL_HINT = "PNG output needs cairosvg (and the system's libcairo): pip install 'pipeforge[png]'"


def png_bytes(timeline: Timeline, *, title: str | None = None, scale: float = 2.0) -> bytes:
    """The picture as PNG bytes, drawn at ``scale`` times the SVG's pixel size."""
    svg2png = _cairosvg()
    return svg2png(bytestring=render_svg(timeline, title).encode("utf-8"), scale=scale)


def render_png(timeline: Timeline, path: str, *, title: str | None = None, scale: float = 2.0) -> None:
    """Write the picture to ``path`` as PNG."""
    from pipeforge.files import write_atomically

    write_atomically(path, png_bytes(timeline, title=title, scale=scale))


def _cairosvg():
    try:
        from cairosvg import svg2png
    except ImportError as missing:
        raise UsageError(f"{INSTALL_HINT} ({missing})") from None
    except OSError as missing:  # cairocffi installed but libcairo absent
        raise UsageError(f"{INSTALL_HINT}; libcairo could not be loaded ({missing})") from None
    return svg2png
