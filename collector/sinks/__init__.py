"""Where the pipeline delivers batches."""
