"""Drop-in replacements for ``torch.nn.RNN``, ``LSTM`` and ``GRU``.

``from rnnkit import nn`` (or ``rnnkit.nn.LSTM``) gives torch's interface computed by
rnnkit's layers; see :mod:`rnnkit.layers.torch_nn` and ``docs/torch-nn.md``.

>>> import torch
>>> from rnnkit import nn
>>> reference = torch.nn.LSTM(3, 4, num_layers=2)
>>> lstm = nn.LSTM(3, 4, num_layers=2)
>>> lstm.load_state_dict(reference.state_dict())
<All keys matched successfully>
>>> x = torch.randn(5, 2, 3)
>>> torch.allclose(lstm(x)[0], reference(x)[0], atol=1e-6)
True
"""

from rnnkit.layers.torch_nn import GRU, LSTM, RNN

__all__ = ["GRU", "LSTM", "RNN"]
