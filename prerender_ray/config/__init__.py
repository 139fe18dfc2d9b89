"""The configuration: the one model, loading it from YAML and the environment, live overrides."""
