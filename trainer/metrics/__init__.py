"""Step timings, bubble analysis and Chrome traces of a training run."""
