"""A character-level name classifier written as people write one with packed sequences
(the names-by-language classification of the PyTorch tutorials, batched): characters to
indices, ``pad_sequence``, ``pack_padded_sequence(..., enforce_sorted=False)``, a
bidirectional two-layer ``nn.GRU`` with ``batch_first=True``, the last layer's final
states of both directions (``h_n[-2]``, ``h_n[-1]``) concatenated with the
``pad_packed_sequence`` outputs mean-pooled over the true lengths, cross-entropy, Adam
with gradient clipping, accuracy and predictions. The drop-in tests run it twice,
changing only the import line."""

import string

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

LETTERS = string.ascii_lowercase
LANGUAGES = ["dutch", "greek", "italian"]
ENDINGS = {"dutch": ["ijk", "sen", "er"], "greek": ["os", "is", "ou"], "italian": ["ini", "o", "a"]}


def make_names(n, generator):
    """``n`` made-up names, each a random stem plus its language's ending, and labels;
    one name of a single letter (a length-1 sequence in the batch)."""
    names, labels = [], []
    for i in range(n):
        label = int(torch.randint(len(LANGUAGES), (1,), generator=generator))
        stem_length = int(torch.randint(1, 7, (1,), generator=generator))
        stem = "".join(
            LETTERS[int(j)] for j in torch.randint(26, (stem_length,), generator=generator)
        )
        endings = ENDINGS[LANGUAGES[label]]
        ending = endings[int(torch.randint(len(endings), (1,), generator=generator))]
        names.append(stem[:1] if i == 0 else stem + ending)
        labels.append(label)
    return names, torch.tensor(labels)


def name_to_tensor(name):
    return torch.tensor([LETTERS.index(c) + 1 for c in name])  # 0 is the padding index


def batchify(names):
    tensors = [name_to_tensor(n) for n in names]
    lengths = torch.tensor([len(t) for t in tensors])
    return pad_sequence(tensors, batch_first=True, padding_value=0), lengths


class NameClassifier(nn.Module):
    def __init__(self, n_chars, n_classes, emb=8, hidden=12):
        super().__init__()
        self.embedding = nn.Embedding(n_chars, emb, padding_idx=0)
        self.rnn = nn.GRU(emb, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(4 * hidden, n_classes)

    def forward(self, padded, lengths):
        embedded = self.embedding(padded)
        packed = pack_padded_sequence(embedded, lengths, batch_first=True, enforce_sorted=False)
        packed_out, h_n = self.rnn(packed)
        out, out_lengths = pad_packed_sequence(packed_out, batch_first=True)
        mean = out.sum(dim=1) / out_lengths.unsqueeze(1).to(out.dtype)
        last = torch.cat((h_n[-2], h_n[-1]), dim=1)
        return self.fc(torch.cat((last, mean), dim=1))


def main(dtype=torch.float32, epochs=20):
    torch.manual_seed(7)
    generator = torch.Generator().manual_seed(3)
    train_names, train_labels = make_names(24, generator)
    test_names, test_labels = make_names(9, generator)
    padded, lengths = batchify(train_names)
    test_padded, test_lengths = batchify(test_names)
    model = NameClassifier(len(LETTERS) + 1, len(LANGUAGES)).to(dtype)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    losses = []
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        loss = criterion(model(padded, lengths), train_labels)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        logits = model(test_padded, test_lengths)
        predicted = logits.argmax(dim=1)
        accuracy = (predicted == test_labels).float().mean().item()
        probabilities = torch.softmax(logits, dim=1)
    return {
        "losses": losses,
        "accuracy": accuracy,
        "predicted": predicted.tolist(),
        "probabilities": probabilities.flatten().tolist(),
        "names": train_names[:3],
    }
