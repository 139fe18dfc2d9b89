"""prerender-ray: serves prerendered pages to bots, schedules re-renders and feeds a render fleet.

This package is the pure core: no Ray and no HTTP. ``prerender_ray.actors`` (Ray actors and the
CLI) and ``prerender_ray.api`` (FastAPI apps) are thin layers over it.

The modules of a bot hit's per-URL path run compiled where ``make install`` could compile them, and
only while their sources are those it compiled (``prerender_ray.native``).
"""

from prerender_ray import native as _native

_native.install()

__version__ = "0.1.0"
