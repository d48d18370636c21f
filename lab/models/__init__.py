"""Models only the benchmarks (and their tests) use: the all-reduce across W GPUs, the fixed costs at few rows,
the fit of the tile rule."""
