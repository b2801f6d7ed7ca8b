"""What the product is for: message format, two-phase compaction, compacted view,
scheduler, Spark engine. (The compactor itself lands with the compactor issue.)"""

__all__: list[str] = []
