"""The SitemapWalker actor: background sitemap walks, their fetches and progress."""
