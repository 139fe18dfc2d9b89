"""Sitemap ingestion: the streaming parser and the pure reconcile rules."""
