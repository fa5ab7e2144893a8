"""A sequence regressor trained with the memory-saving and optimizer idioms of real
training scripts: the recurrent layer called through ``torch.utils.checkpoint.checkpoint``
(reentrant or not; a two-layer ``nn.LSTM`` with dropout between its layers, whose masks
the recomputation must draw again), ``weight_norm`` on its ``weight_hh_l0`` and
``spectral_norm`` on a following ``nn.GRU``'s ``weight_hh_l0``
(``torch.nn.utils.parametrizations``), parameter groups from ``named_parameters()`` with
no weight decay on biases, ``AdamW`` with a ``OneCycleLR`` or ``LambdaLR`` schedule,
``clip_grad_value_``, ``parameters_to_vector``, and an exponential moving average of the
weights in ``torch.optim.swa_utils.AveragedModel`` (a deep copy of the model), whose
``state_dict`` is loaded into a fresh model that predicts as the average does. The
drop-in tests run it twice, changing only the import line."""

import torch
from torch import nn
from torch.nn.utils import clip_grad_value_, parameters_to_vector
from torch.nn.utils.parametrizations import spectral_norm, weight_norm
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.checkpoint import checkpoint


class Regressor(nn.Module):
    def __init__(self, features=3, hidden=10, use_reentrant=False, dtype=None):
        super().__init__()
        self.use_reentrant = use_reentrant
        self.inp = nn.Linear(features, hidden, dtype=dtype)
        self.rnn = nn.LSTM(hidden, hidden, num_layers=2, dropout=0.3, batch_first=True, dtype=dtype)
        weight_norm(self.rnn, "weight_hh_l0")
        self.gru = nn.GRU(hidden, hidden, batch_first=True, dtype=dtype)
        spectral_norm(self.gru, "weight_hh_l0")
        self.head = nn.Linear(hidden, 1, dtype=dtype)

    def forward(self, x):
        h = torch.tanh(self.inp(x))  # requires grad: the reentrant checkpoint needs it
        if self.training:
            out, _ = checkpoint(self.rnn, h, use_reentrant=self.use_reentrant)
        else:
            out, _ = self.rnn(h)
        out, _ = self.gru(out)
        return self.head(out[:, -1]).squeeze(1)


def make_data(n, generator, dtype):
    x = torch.randn(n, 7, 3, generator=generator, dtype=dtype)
    y = x[:, -3:, 0].sum(1) - 0.5 * x[:, :, 1].mean(1)
    return x, y


def parameter_groups(model, weight_decay=0.01):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if "bias" in name else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def main(dtype=torch.float64, use_reentrant=False, schedule="onecycle", steps=12):
    torch.manual_seed(11)
    generator = torch.Generator().manual_seed(4)
    x, y = make_data(32, generator, dtype)
    tx, ty = make_data(8, generator, dtype)
    # built in its dtype: `.to(dtype)` would compute the parametrized weights into the
    # layers' `_flat_weights`, which `copy.deepcopy` (AveragedModel) then refuses (torch's
    # own "Only Tensors created explicitly by the user" error)
    model = Regressor(use_reentrant=use_reentrant, dtype=dtype)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.8))
    groups = parameter_groups(model)
    optimizer = torch.optim.AdamW(groups, lr=0.01)
    if schedule == "onecycle":
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.02, total_steps=steps)
    else:
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.9**step)
    criterion = nn.MSELoss()
    losses, rates, vectors = [], [], []
    for _ in range(steps):
        model.train()
        batch = torch.randperm(32)[:8]
        optimizer.zero_grad()
        loss = criterion(model(x[batch]), y[batch])
        loss.backward()
        clip_grad_value_(model.parameters(), 0.5)
        optimizer.step()
        scheduler.step()
        ema.update_parameters(model)
        losses.append(loss.item())
        rates.append(scheduler.get_last_lr()[0])
        vectors.append(parameters_to_vector(model.parameters()).sum().item())
    model.eval()
    ema.eval()
    with torch.no_grad():
        predictions = model(tx)
        averaged = ema(tx)
    # the average's state dict ("module." + the model's keys, and n_averaged) in a fresh model
    state = ema.state_dict()
    fresh = Regressor(use_reentrant=use_reentrant, dtype=dtype)
    fresh.load_state_dict({k[len("module.") :]: v for k, v in state.items() if k != "n_averaged"})
    fresh.eval()
    with torch.no_grad():
        reloaded = fresh(tx)
    return {
        "groups": [len(g["params"]) for g in groups],
        "losses": losses,
        "rates": rates,
        "vector_sums": vectors,
        "final_vector": parameters_to_vector(model.parameters()).tolist(),
        "test_loss": criterion(predictions, ty).item(),
        "averaged": averaged.tolist(),
        "reloaded": reloaded.tolist(),
        "n_averaged": int(state["n_averaged"]),
        "state_keys": sorted(state),
        "next_random": torch.rand(3).tolist(),
    }
