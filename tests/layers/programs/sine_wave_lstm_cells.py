"""A sine-wave predictor written as the PyTorch examples' time-sequence prediction
writes one: two stacked ``nn.LSTMCell``s unrolled by hand over the input with float64
zero states, a linear read-out, the whole model in double precision, ``optim.LBFGS``
with a closure on the mean squared error, then predicting steps beyond the input under
``torch.no_grad()``. The drop-in tests run it twice, changing only the import line."""

import torch
import torch.optim as optim
from torch import nn


class Sequence(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, input, future=0):
        outputs = []
        n = input.size(0)
        h_t = torch.zeros(n, self.hidden, dtype=torch.double)
        c_t = torch.zeros(n, self.hidden, dtype=torch.double)
        h_t2 = torch.zeros(n, self.hidden, dtype=torch.double)
        c_t2 = torch.zeros(n, self.hidden, dtype=torch.double)
        output = None
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for _ in range(future):  # feed the prediction back in
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)


def make_waves(n=10, length=60, period=8):
    """Sine waves of one period with random phase shifts, ``(n, length)`` float64."""
    shifts = torch.randint(-4 * period, 4 * period, (n, 1))
    x = torch.arange(length).unsqueeze(0) + shifts
    return torch.sin(x.double() / period)


def main(steps=3, future=20):
    torch.manual_seed(0)
    data = make_waves()
    input, target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]
    seq = Sequence()
    seq.double()
    criterion = nn.MSELoss()
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=8)
    losses, test_losses, predictions = [], [], []
    for _ in range(steps):

        def closure():
            optimizer.zero_grad()
            loss = criterion(seq(input), target)
            losses.append(loss.item())
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            pred = seq(test_input, future=future)
            test_losses.append(criterion(pred[:, :-future], test_target).item())
            predictions.append(pred[:, -future:].flatten().tolist())
    return {"losses": losses, "test_losses": test_losses, "predictions": predictions}
