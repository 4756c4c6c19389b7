"""prepare's steps: scan (read and spill by user partition), samples (per-user sequences into
plan-order buckets) and write (MDS shards); each call writes a completion marker last."""
