"""The ``prerender-ray`` command line: up, status, down, logs, config, render."""
