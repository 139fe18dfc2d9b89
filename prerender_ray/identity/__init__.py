"""What names a page and a node: URLs, cache keys, devices, route classes, ownership."""
