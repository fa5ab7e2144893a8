"""Tasks: the glue from a ``TrainConfig`` to data, model, training loop and metrics."""
