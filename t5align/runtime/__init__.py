"""What a run needs that knows no model: files and output folders, processes of a pod, checks of
values at the boundary, token batches, TPU chip figures. Import the modules themselves."""
