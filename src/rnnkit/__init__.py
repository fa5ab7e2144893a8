"""rnnkit: recurrent sequence models with explicit, inspectable backpropagation through time."""

__version__ = "0.1.0"
