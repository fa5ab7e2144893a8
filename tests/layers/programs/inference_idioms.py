"""A character-level language model put to use as people deploy one: trained for a few
steps, then ``model.eval()`` and ``torch.inference_mode()`` for scoring a padded batch,
a packed batch (``pack_sequence``) and greedy, then sampled, generation one character
at a time with the ``(h, c)`` state carried between calls; ``torch.jit.trace`` of the
whole model run on inputs of other lengths and batch sizes; ``torch.compile`` of it;
and dynamic quantization with torch's own ``quantize_dynamic(model, {nn.LSTM,
nn.Linear}, dtype=torch.qint8)`` as PyTorch's tutorial writes it. The drop-in tests run
it twice, changing only the import line."""

import torch
from torch import nn
from torch.nn.utils.rnn import pack_sequence, pad_packed_sequence

ALPHABET = "abcdefgh "


class CharLM(nn.Module):
    def __init__(self, vocab=9, emb=8, hidden=16):
        super().__init__()
        self.embedding = nn.Embedding(vocab, emb)
        self.rnn = nn.LSTM(emb, hidden, num_layers=2, dropout=0.2)
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, ids, state=None):
        """``ids (T, B)`` → logits ``(T, B, V)`` and the state."""
        out, state = self.rnn(self.embedding(ids), state)
        return self.decoder(out), state

    def score_packed(self, sequences):
        """Per-step logits of sequences of different lengths, padded after the LSTM."""
        packed = pack_sequence([self.embedding(s) for s in sequences], enforce_sorted=False)
        out, _ = self.rnn(packed)
        padded, lengths = pad_packed_sequence(out)
        return self.decoder(padded), lengths


def encode(text):
    return torch.tensor([ALPHABET.index(c) for c in text])


def generate(model, prompt, length, sample=False, generator=None):
    """One character at a time, the state carried between calls."""
    logits, state = model(encode(prompt).unsqueeze(1))
    chars = []
    for _ in range(length):
        last = logits[-1, 0]
        if sample:
            index = int(torch.multinomial(last.softmax(-1), 1, generator=generator))
        else:
            index = int(last.argmax())
        chars.append(ALPHABET[index])
        logits, state = model(torch.tensor([[index]]), state)
    return "".join(chars)


def main(dtype=torch.float32, quantize=True, backend="inductor", steps=15):
    torch.manual_seed(3)
    text = "abc defg hab cde fgh " * 6
    data = encode(text)
    model = CharLM().to(dtype)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    criterion = nn.CrossEntropyLoss()
    inputs = data[:-1].view(-1, 5).t()  # (T, B): five streams
    targets = data[1:].view(-1, 5).t()
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        logits, _ = model(inputs)
        loss = criterion(logits.reshape(-1, len(ALPHABET)), targets.reshape(-1))
        loss.backward()
        optimizer.step()

    model.eval()
    with torch.inference_mode():
        logits, (h_n, c_n) = model(inputs)
        batch_loss = criterion(logits.reshape(-1, len(ALPHABET)), targets.reshape(-1)).item()
        packed_logits, lengths = model.score_packed([encode("abc de"), encode("fg"), encode("h")])
        greedy = generate(model, "abc ", 12)
        sampled = generate(model, "de", 12, True, torch.Generator().manual_seed(1))

    example = torch.randint(len(ALPHABET), (7, 2))
    traced = torch.jit.trace(model, (example,))
    other = torch.randint(len(ALPHABET), (4, 3), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        eager_other, _ = model(other)
        traced_other, _ = traced(other)
        compiled_other, _ = torch.compile(model, backend=backend)(other)

    result = {}
    if quantize:  # torch's quantized LSTM computes in float32 only
        quantized = torch.ao.quantization.quantize_dynamic(
            model, {nn.LSTM, nn.Linear}, dtype=torch.qint8
        )
        with torch.no_grad():
            quantized_other, _ = quantized(other)
        result["quantized"] = quantized_other.flatten().tolist()
        result["quantized_types"] = [
            f"{type(m).__module__}.{type(m).__name__}" for m in quantized.children()
        ]
    return result | {
        "loss": loss.item(),
        "batch_loss": batch_loss,
        "h_n": h_n.flatten().tolist(),
        "c_n": c_n.flatten().tolist(),
        "packed_logits": packed_logits.flatten().tolist(),
        "lengths": lengths.tolist(),
        "greedy": greedy,
        "sampled": sampled,
        "eager": eager_other.flatten().tolist(),
        "traced": traced_other.flatten().tolist(),
        "compiled": compiled_other.flatten().tolist(),
        "next_random": torch.rand(3).tolist(),
    }
