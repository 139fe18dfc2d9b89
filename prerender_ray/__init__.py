"""prerender-ray: serves prerendered pages to bots, schedules re-renders and feeds a render fleet.

This package is the pure core: no Ray and no HTTP. ``prerender_ray.actors`` (Ray actors and the
CLI) and ``prerender_ray.api`` (FastAPI apps) are thin layers over it.
"""

__version__ = "0.1.0"
