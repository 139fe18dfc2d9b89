"""The admin side's pure parts: users and roles, sessions, the URL explainer, cluster sums."""
