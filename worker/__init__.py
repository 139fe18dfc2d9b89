"""The render worker: claims jobs from prerender-ray (or any queue speaking the reference render-fleet
protocol), renders them in headless Chromium through Playwright and posts the HTML back.

Run it with ``prerender-ray render --queue URL`` (or ``python -m prerender_ray.worker``). Modules:
``options`` (flags), ``backoff`` (which host to claim from, when), ``client`` (claim, result, queue
status over HTTP), ``outcome`` (verdicts and the wire format), ``pool`` (Chromium's lifecycle),
``render`` (one page), ``main`` (the loop, shutdown, stats), ``metrics``, ``supervise`` (the
worker `prerender-ray up --with-worker` starts).
"""

from prerender_ray.worker.options import WorkerOptions

__all__ = ["WorkerOptions"]
