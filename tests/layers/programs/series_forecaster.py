"""A variable-length time-series regressor written as people write one for sensor or
sales data: a ``DataLoader`` that shuffles, series packed with
``pack_padded_sequence(..., enforce_sorted=False)``, a two-layer ``nn.RNN`` with
``nonlinearity="relu"`` and dropout between its layers, then a two-layer projected
``nn.LSTM`` (``proj_size``) also with dropout, orthogonal recurrent weights,
``flatten_parameters()`` before each call, ``model.train()`` / ``model.eval()``, the best
``state_dict`` kept by validation loss, saved with ``torch.save`` and loaded into a
freshly built model that predicts the test series. The drop-in tests run it twice,
changing only the import line."""

import copy

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence
from torch.utils.data import DataLoader, TensorDataset


class Forecaster(nn.Module):
    def __init__(self, n_features=3, hidden=16, proj=6, dropout=0.25):
        super().__init__()
        self.encoder = nn.RNN(
            n_features, hidden, num_layers=2, nonlinearity="relu", dropout=dropout,
            batch_first=True,
        )  # fmt: skip
        self.lstm = nn.LSTM(
            hidden, hidden, num_layers=2, proj_size=proj, dropout=dropout, batch_first=True
        )
        self.head = nn.Linear(proj, 1)
        for name, param in self.named_parameters():
            if "weight_hh" in name:
                nn.init.orthogonal_(param)
            elif "bias" in name:
                nn.init.zeros_(param)

    def forward(self, x, lengths):
        self.encoder.flatten_parameters()
        self.lstm.flatten_parameters()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        encoded, _ = self.encoder(packed)
        _, (h_n, _) = self.lstm(encoded)
        return self.head(h_n[-1]).squeeze(1)  # the top layer's last state, (B, proj)


def make_series(n, max_length=12, generator=None):
    """``n`` noisy series of 3 features and random lengths; the target is a weighted
    sum of each series' last values."""
    lengths = torch.randint(2, max_length + 1, (n,), generator=generator)
    x = torch.randn(n, max_length, 3, generator=generator).cumsum(1) * 0.3
    steps = torch.arange(max_length).unsqueeze(0)
    x = x * (steps < lengths.unsqueeze(1)).unsqueeze(2)  # zero padding
    last = x[torch.arange(n), lengths - 1]
    y = last @ torch.tensor([0.5, -1.0, 0.25]) + 0.1
    return x, lengths, y


def evaluate(model, x, lengths, y, criterion):
    model.eval()
    with torch.no_grad():
        return criterion(model(x, lengths), y).item()


def main(path, dtype=torch.float32, epochs=4):
    torch.manual_seed(2024)
    generator = torch.Generator().manual_seed(9)
    x, lengths, y = make_series(48, generator=generator)
    vx, vlengths, vy = make_series(12, generator=generator)
    tx, tlengths, ty = make_series(6, generator=generator)
    x, vx, tx, y, vy, ty = (t.to(dtype) for t in (x, vx, tx, y, vy, ty))
    loader = DataLoader(TensorDataset(x, lengths, y), batch_size=8, shuffle=True)
    model = Forecaster().to(dtype)
    criterion = nn.MSELoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses, valid_losses, orders = [], [], []
    best, best_state = float("inf"), None
    for _ in range(epochs):
        model.train()
        for bx, blengths, by in loader:
            optimizer.zero_grad()
            loss = criterion(model(bx, blengths), by)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            orders.append(blengths.tolist())
        valid = evaluate(model, vx, vlengths, vy, criterion)
        valid_losses.append(valid)
        if valid < best:
            best, best_state = valid, copy.deepcopy(model.state_dict())
    torch.save(best_state, path)
    fresh = Forecaster().to(dtype)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    fresh.eval()
    with torch.no_grad():
        predictions = fresh(tx, tlengths)
    return {
        "losses": losses,
        "valid_losses": valid_losses,
        "orders": orders,
        "test_loss": criterion(predictions, ty).item(),
        "predictions": predictions.tolist(),
        "next_random": torch.rand(3).tolist(),
    }
