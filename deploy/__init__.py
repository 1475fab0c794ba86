"""The deployment: the CLI (`specfleet`), the service configuration, the benchmark, the specialists
builder and the prompt sets on top; the speculative core in deploy/engine/ and the service in
deploy/service/ below them (docs/design.md lays out the layers)."""
