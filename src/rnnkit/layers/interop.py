"""Exchange with ``torch.nn``: copy weights both ways, and convert GRU conventions.

PyTorch keeps two biases per gate (``b_ih + b_hh``); rnnkit keeps one, so
``from_torch`` adds them — except the GRU candidate's recurrent bias, which sits inside
``r ⊙ (W_hn h + b_hn)`` and becomes ``bias_hn``. PyTorch's GRU is rnnkit's
``update="keep", reset="after"``. Gate orders agree (LSTM i,f,g,o; GRU r,z,n).
"""

from __future__ import annotations

import torch
from torch import nn

from rnnkit.cells.base import CellBase
from rnnkit.cells.gru import GRUCell
from rnnkit.cells.lstm import LSTMCell
from rnnkit.cells.rnn import RNNCell
from rnnkit.layers.cell_stacks import GRU, LSTM, RNN
from rnnkit.layers.stacked import StackedRecurrent, between_layers

__all__ = ["convert_gru_update", "count_parameters", "from_torch", "to_torch"]


def count_parameters(module: nn.Module) -> int:
    """Number of trainable scalars of ``module``.

    >>> count_parameters(RNNCell(10, 20)) + count_parameters(nn.Linear(20, 5))  # 600 + 20 + 105
    725
    """
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _cell_from_torch_params(cell: CellBase, w_ih, w_hh, b_ih, b_hh) -> None:
    H = cell.hidden_size
    with torch.no_grad():
        cell.weight_ih.copy_(w_ih)
        cell.weight_hh.copy_(w_hh)
        b_ih = torch.zeros_like(cell.bias) if b_ih is None else b_ih
        b_hh = torch.zeros_like(cell.bias) if b_hh is None else b_hh
        if isinstance(cell, GRUCell):
            assert cell.bias_hn is not None  # from_torch builds GRUs with reset="after"
            cell.bias.copy_(b_ih)
            cell.bias[: 2 * H] += b_hh[: 2 * H]
            cell.bias_hn.copy_(b_hh[2 * H :])
        else:
            cell.bias.copy_(b_ih + b_hh)


def _new_cell(kind: type, I: int, H: int, nonlinearity: str, like: torch.Tensor) -> CellBase:
    if kind is RNNCell:
        cell: CellBase = RNNCell(I, H, nonlinearity=nonlinearity)
    elif kind is LSTMCell:
        cell = LSTMCell(I, H)
    else:
        cell = GRUCell(I, H, update="keep", reset="after")
    return cell.to(device=like.device, dtype=like.dtype)


_TORCH_CELLS = {nn.RNNCell: RNNCell, nn.LSTMCell: LSTMCell, nn.GRUCell: GRUCell}
_TORCH_LAYERS = {nn.RNN: (RNN, RNNCell), nn.LSTM: (LSTM, LSTMCell), nn.GRU: (GRU, GRUCell)}


def _drop_ins() -> dict[type, type]:
    """``rnnkit.nn``'s drop-in classes and the ``torch.nn`` class each one computes."""
    from rnnkit.layers import torch_nn, torch_nn_cells  # they build on this package's layers

    return {
        torch_nn.RNN: nn.RNN,
        torch_nn.LSTM: nn.LSTM,
        torch_nn.GRU: nn.GRU,
        torch_nn_cells.RNNCell: nn.RNNCell,
        torch_nn_cells.LSTMCell: nn.LSTMCell,
        torch_nn_cells.GRUCell: nn.GRUCell,
    }


def from_torch(m: nn.Module) -> nn.Module:
    """An rnnkit cell or layer computing exactly what the ``torch.nn`` module ``m`` does.

    Accepts ``nn.RNN/LSTM/GRU`` (any depth, bidirectional, dropout; ``batch_first`` is
    carried over) and ``nn.RNNCell/LSTMCell/GRUCell``, and ``rnnkit.nn``'s drop-ins of
    them; weights are copied, and the GRU
    becomes ``update="keep", reset="after"``. ``proj_size`` (projected LSTM) has no
    rnnkit form and is an error.

    >>> t = nn.GRU(3, 4, batch_first=True)
    >>> k = from_torch(t)
    >>> x = torch.randn(2, 5, 3)
    >>> torch.allclose(k(x).outputs, t(x)[0], atol=1e-6)
    True
    """
    # The exact classes: a subclass of a torch module may compute something else; rnnkit.nn's
    # drop-ins compute torch's function (their own subclasses are refused as torch's are).
    torch_class = _drop_ins().get(type(m), type(m))
    cell_kind = _TORCH_CELLS.get(torch_class)
    if cell_kind is not None and isinstance(m, nn.RNNCellBase):
        like = m.weight_ih
        nonlinearity = getattr(m, "nonlinearity", "tanh")
        cell = _new_cell(cell_kind, m.input_size, m.hidden_size, nonlinearity, like)
        cell.train(m.training)
        _cell_from_torch_params(cell, m.weight_ih, m.weight_hh, m.bias_ih, m.bias_hh)
        return cell
    layer_kind = _TORCH_LAYERS.get(torch_class)
    if layer_kind is not None and isinstance(m, nn.RNNBase):
        layer_cls, kind = layer_kind
        if getattr(m, "proj_size", 0):
            raise ValueError("from_torch: nn.LSTM with proj_size has no rnnkit equivalent")
        like = m.get_parameter("weight_ih_l0")
        options: dict[str, str] = {}
        if isinstance(m, nn.RNN):
            options["nonlinearity"] = m.nonlinearity
        elif kind is GRUCell:
            options = {"update": "keep", "reset": "after"}
        layer = layer_cls(
            m.input_size,
            m.hidden_size,
            m.num_layers,
            m.bidirectional,
            between_layers(m.dropout, m.num_layers),
            m.batch_first,
            **options,
        ).to(device=like.device, dtype=like.dtype)
        layer.train(m.training)  # dropout between layers acts only in training mode
        cells = layer.cells()
        D = 2 if m.bidirectional else 1
        for index, cell in enumerate(cells):
            layer_index, d = divmod(index, D)
            sfx = f"_l{layer_index}" + ("_reverse" if d == 1 else "")
            _cell_from_torch_params(
                cell,
                getattr(m, "weight_ih" + sfx),
                getattr(m, "weight_hh" + sfx),
                getattr(m, "bias_ih" + sfx, None),
                getattr(m, "bias_hh" + sfx, None),
            )
        return layer
    raise TypeError(
        f"from_torch expects torch.nn.RNN/LSTM/GRU or their cells, got {type(m).__name__}"
    )


def _check_torch_form(cell: CellBase) -> None:
    if type(cell) not in (RNNCell, LSTMCell, GRUCell):
        raise ValueError(
            f"to_torch: torch.nn has no {type(cell).__name__} (a layer-normalised cell: "
            "normalisations torch.nn's layers lack)"
        )
    if isinstance(cell, RNNCell) and cell.nonlinearity not in ("tanh", "relu"):
        raise ValueError(
            f"to_torch: torch.nn.RNN has tanh and relu only; this cell uses "
            f"nonlinearity={cell.nonlinearity!r}"
        )
    if isinstance(cell, GRUCell) and (cell.update, cell.reset) != ("keep", "after"):
        hint = (
            " (convert_gru_update gives the same function with update='keep')"
            if cell.reset == "after"
            else ""
        )
        raise ValueError(
            f"to_torch: torch.nn.GRU computes update='keep', reset='after'; this GRU has "
            f"update={cell.update!r}, reset={cell.reset!r}, which torch has no form for{hint}"
        )


def _copy_to_torch(cell: CellBase, w_ih, w_hh, b_ih, b_hh) -> None:
    H = cell.hidden_size
    with torch.no_grad():
        w_ih.copy_(cell.weight_ih)
        w_hh.copy_(cell.weight_hh)
        b_ih.copy_(cell.bias)
        b_hh.zero_()
        if isinstance(cell, GRUCell):
            b_hh[2 * H :] = cell.bias_hn


def to_torch(m: nn.Module) -> nn.Module:
    """The ``torch.nn`` module computing what ``m`` does (layers keep their ``batch_first``,
    so ``to_torch(from_torch(t))`` reads inputs as ``t`` does).

    A form torch lacks (a GRU other than ``update="keep", reset="after"``) is a
    ``ValueError`` that says so.

    >>> k = LSTM(3, 4, num_layers=2)
    >>> t = to_torch(k)
    >>> x = torch.randn(2, 5, 3)
    >>> torch.allclose(k(x).outputs, t(x)[0], atol=1e-6)
    True
    """
    kinds = {RNNCell: nn.RNNCell, LSTMCell: nn.LSTMCell, GRUCell: nn.GRUCell}
    if isinstance(m, CellBase):
        _check_torch_form(m)
        torch_cls = kinds[type(m)]
        kwargs = {"nonlinearity": m.nonlinearity} if isinstance(m, RNNCell) else {}
        out = torch_cls(m.input_size, m.hidden_size, **kwargs)
        out = out.to(device=m.weight_ih.device, dtype=m.weight_ih.dtype)
        _copy_to_torch(m, out.weight_ih, out.weight_hh, out.bias_ih, out.bias_hh)
        return out.train(m.training)
    if isinstance(m, StackedRecurrent):
        cells = m.cells()
        for cell in cells:
            _check_torch_form(cell)
        first = cells[0]
        if any(type(c) is not type(first) for c in cells):
            raise ValueError(
                "to_torch: a torch.nn layer has one cell kind for all layers; this stack mixes "
                f"{sorted({type(c).__name__ for c in cells})}"
            )
        if len(set(m.hidden_sizes)) > 1:
            raise ValueError(
                "to_torch: a torch.nn layer gives both directions one width; this stack's "
                f"are {m.hidden_sizes}"
            )
        _check_regularizers(m)
        phis = {c.nonlinearity for c in cells if isinstance(c, RNNCell)}
        if len(phis) > 1:
            raise ValueError(
                "to_torch: torch.nn.RNN has one nonlinearity for all layers; this stack mixes "
                f"{sorted(phis)}"
            )
        torch_cls = {RNNCell: nn.RNN, LSTMCell: nn.LSTM, GRUCell: nn.GRU}[type(first)]
        kwargs = {"nonlinearity": first.nonlinearity} if isinstance(first, RNNCell) else {}
        out = torch_cls(
            m.input_size,
            m.hidden_size,
            num_layers=m.num_layers,
            bidirectional=m.bidirectional,
            # One layer has no "between layers": torch would warn about its dropout.
            dropout=m.dropout if m.num_layers > 1 else 0.0,
            batch_first=m.batch_first,
            **kwargs,
        ).to(device=first.weight_ih.device, dtype=first.weight_ih.dtype)
        D = m.num_directions
        for index, cell in enumerate(cells):
            layer_index, d = divmod(index, D)
            sfx = f"_l{layer_index}" + ("_reverse" if d == 1 else "")
            _copy_to_torch(
                cell,
                getattr(out, "weight_ih" + sfx),
                getattr(out, "weight_hh" + sfx),
                getattr(out, "bias_ih" + sfx),
                getattr(out, "bias_hh" + sfx),
            )
        return out.train(m.training)
    raise TypeError(f"to_torch expects an rnnkit cell or layer, got {type(m).__name__}")


def _check_regularizers(m: StackedRecurrent) -> None:
    """torch.nn's layers have none of the stack's regularizers: zoneout changes what the
    layer computes at evaluation too, the others only in training."""
    names = ("zoneout",) if not m.training else (
        "input_dropout", "locked_dropout", "output_dropout", "recurrent_dropout",
        "weight_drop", "zoneout",
    )  # fmt: skip
    used = [f"{n}={getattr(m, n)}" for n in names if getattr(m, n, 0.0)]
    if used:
        when = "" if not m.training or used == [f"zoneout={m.zoneout}"] else " in training"
        raise ValueError(
            f"to_torch: a torch.nn layer has no {', '.join(used)}{when}; convert the layer "
            "in eval() for the dropouts, zoneout has no torch.nn form"
        )


def _flip_update(cell: GRUCell) -> GRUCell:
    update = "keep" if cell.update == "candidate" else "candidate"
    new = GRUCell(cell.input_size, cell.hidden_size, update=update, reset=cell.reset)
    new = new.to(device=cell.weight_ih.device, dtype=cell.weight_ih.dtype)
    new.load_state_dict(cell.state_dict())
    H = cell.hidden_size
    with torch.no_grad():  # 1 − σ(s) = σ(−s): negate the z rows
        new.weight_ih[H : 2 * H].neg_()
        new.weight_hh[H : 2 * H].neg_()
        new.bias[H : 2 * H].neg_()
    return new


def convert_gru_update(m: nn.Module) -> nn.Module:
    """A GRU (cell or layer) of the other ``update`` convention computing the same function.

    >>> a = GRUCell(3, 4)
    >>> b = convert_gru_update(a)
    >>> b.update, torch.allclose(a(torch.ones(1, 3)), b(torch.ones(1, 3)))
    ('keep', True)
    """
    if isinstance(m, GRUCell):
        return _flip_update(m)
    cells = m.cells() if isinstance(m, StackedRecurrent) else []
    grus = [c for c in cells if isinstance(c, GRUCell)]
    if isinstance(m, StackedRecurrent) and len(grus) == len(cells):  # GRU cells only
        first = grus[0]
        update = "keep" if first.update == "candidate" else "candidate"
        new = GRU(
            m.input_size,
            m.hidden_size,
            m.num_layers,
            m.bidirectional,
            between_layers(m.dropout, m.num_layers),
            m.batch_first,
            update=update,
            reset=first.reset,
        ).to(device=first.weight_ih.device, dtype=first.weight_ih.dtype)
        for old_cell, new_cell in zip(grus, new.cells(), strict=True):
            new_cell.load_state_dict(_flip_update(old_cell).state_dict())
        return new
    raise TypeError(f"convert_gru_update expects a GRUCell or GRU, got {type(m).__name__}")
