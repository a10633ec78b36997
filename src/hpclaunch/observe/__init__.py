"""Watching runs: the wait loop, logs, a job's end, GPU metrics, top, plot, stacks, attach."""
