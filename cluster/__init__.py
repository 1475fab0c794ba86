"""Ray connection, resources and placement (filled by the distributed-service and cluster issues)."""
