"""The admin API under /prerender_admin and its console."""
