"""What a run needs that knows no model: files and output folders, resumable record logs, processes
of a pod, checks of values at the boundary, token batches, TPU chip figures, compiled programs'
costs. Import the modules themselves."""
