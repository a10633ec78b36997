"""JobSpec -> job script: render, launchers, the script's end, requeue, the GPU watch's
lines, profiling, the run folder's files."""
