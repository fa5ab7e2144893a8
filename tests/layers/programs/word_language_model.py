"""A word language model written as the PyTorch examples write one (an RNNModel of
Embedding, a recurrent layer by name and a Linear decoder; truncated BPTT with the hidden
state repackaged; manual SGD with clipping; evaluation; saving and loading the whole
model; sampling words). The drop-in tests run it twice, changing only the import line."""

import math

import torch
from torch import nn


class RNNModel(nn.Module):
    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.0, tie_weights=False):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        if tie_weights:
            self.decoder.weight = self.encoder.weight
        self.rnn_type, self.nhid, self.nlayers = rnn_type, nhid, nlayers

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (
                weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid),
            )
        return weight.new_zeros(self.nlayers, bsz, self.nhid)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous()


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].view(-1)


def evaluate(model, source, bptt):
    model.eval()
    total, hidden = 0.0, model.init_hidden(source.size(1))
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, bptt):
            data, targets = get_batch(source, i, bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total += len(data) * nn.functional.nll_loss(output, targets).item()
    return total / (len(source) - 1)


def main(rnn_type, path, steps=12, lr=2.0, bptt=7):
    torch.manual_seed(1111)
    corpus = torch.randint(0, 30, (600,))
    train, valid = batchify(corpus[:480], 4), batchify(corpus[480:], 2)
    model = RNNModel(rnn_type, 30, 8, 12, 2).double()
    criterion = nn.NLLLoss()
    model.train()
    hidden = model.init_hidden(4)
    losses = []
    for step, i in enumerate(range(0, train.size(0) - 1, bptt)):
        if step == steps:
            break
        data, targets = get_batch(train, i, bptt)
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        losses.append(loss.item())
    with open(path, "wb") as f:
        torch.save(model, f)
    with open(path, "rb") as f:
        allowed = [RNNModel, nn.Dropout, nn.Embedding, nn.Linear, getattr(nn, rnn_type)]
        with torch.serialization.safe_globals(allowed):
            model = torch.load(f, weights_only=True)
    ppl = math.exp(evaluate(model, valid, bptt))
    hidden = model.init_hidden(1)
    word = torch.randint(30, (1, 1), dtype=torch.long)
    words = []
    with torch.no_grad():
        for _ in range(20):
            output, hidden = model(word, hidden)
            word_weights = output.squeeze().div(1.0).exp()
            word_idx = torch.multinomial(word_weights, 1)[0]
            word.fill_(word_idx)
            words.append(int(word_idx))
    return {"losses": losses, "ppl": ppl, "words": words}
