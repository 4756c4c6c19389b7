"""From prepared micro-batches to model-ready jagged batches."""
