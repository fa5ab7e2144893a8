"""A text-line recognizer written as people write a CRNN for OCR or speech: a small
``nn.Conv2d`` feature extractor over an image of glyphs, its columns as a time axis
(``permute`` to ``(T, B, C·H)``, a view that is not contiguous), a bidirectional
two-layer ``nn.LSTM`` with dropout between its layers, a ``nn.Linear`` to the alphabet
plus a blank, ``log_softmax`` and ``nn.CTCLoss`` with per-image input and target lengths,
Adam with a step learning-rate schedule, then greedy CTC decoding (best
path, repeats merged, blanks dropped). The drop-in tests run it twice, changing only the
import line."""

import torch
from torch import nn

BLANK, N_SYMBOLS, GLYPH_WIDTH, HEIGHT = 0, 4, 3, 6


def glyphs(generator):
    """One fixed random ``HEIGHT × GLYPH_WIDTH`` picture per symbol (1 … N_SYMBOLS)."""
    return torch.rand(N_SYMBOLS + 1, HEIGHT, GLYPH_WIDTH, generator=generator)


def make_lines(n, shapes, generator, max_symbols=3):
    """``n`` noisy images ``(n, 1, HEIGHT, W)`` of 1 to ``max_symbols`` symbols, a blank
    column after each; the labels concatenated, and each image's label length."""
    width = max_symbols * (GLYPH_WIDTH + 1)
    images = torch.zeros(n, 1, HEIGHT, width)
    labels, lengths = [], []
    for i in range(n):
        count = int(torch.randint(1, max_symbols + 1, (1,), generator=generator))
        symbols = torch.randint(1, N_SYMBOLS + 1, (count,), generator=generator)
        for k, s in enumerate(symbols.tolist()):
            start = k * (GLYPH_WIDTH + 1)
            images[i, 0, :, start : start + GLYPH_WIDTH] = shapes[s]
        labels.append(symbols)
        lengths.append(count)
    images += 0.05 * torch.randn(images.shape, generator=generator)
    return images, torch.cat(labels), torch.tensor(lengths)


class CRNN(nn.Module):
    def __init__(self, hidden=16, channels=4):
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(1, channels, kernel_size=3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=(2, 1)),  # halve the height, keep every column
        )
        self.rnn = nn.LSTM(channels * HEIGHT // 2, hidden, num_layers=2, bidirectional=True,
                           dropout=0.2)  # fmt: skip
        self.fc = nn.Linear(2 * hidden, N_SYMBOLS + 1)

    def forward(self, images):
        features = self.cnn(images)  # (B, C, H', W)
        b, c, h, w = features.size()
        features = features.view(b, c * h, w).permute(2, 0, 1)  # (T = W, B, C·H')
        output, _ = self.rnn(features)
        return self.fc(output).log_softmax(2)  # (T, B, classes)


def greedy_decode(log_probs):
    best = log_probs.argmax(2).t().tolist()  # (B, T)
    decoded = []
    for path in best:
        out, previous = [], BLANK
        for s in path:
            if s != previous and s != BLANK:
                out.append(s)
            previous = s
        decoded.append(out)
    return decoded


def main(dtype=torch.float32, epochs=150):
    torch.manual_seed(11)
    generator = torch.Generator().manual_seed(4)
    shapes = glyphs(generator)
    images, labels, label_lengths = make_lines(16, shapes, generator)
    test_images, test_labels, test_lengths = make_lines(4, shapes, generator)
    model = CRNN().to(dtype)
    images, test_images = images.to(dtype), test_images.to(dtype)
    criterion = nn.CTCLoss(blank=BLANK, zero_infinity=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    losses = []
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        log_probs = model(images)
        input_lengths = torch.full((images.size(0),), log_probs.size(0), dtype=torch.long)
        loss = criterion(log_probs, labels, input_lengths, label_lengths)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 5.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    with torch.no_grad():
        log_probs = model(test_images)
    truth = [t.tolist() for t in test_labels.split(test_lengths.tolist())]
    decoded = greedy_decode(log_probs)
    return {
        "losses": losses,
        "log_probs": log_probs.flatten().tolist(),
        "decoded": decoded,
        "correct": sum(d == t for d, t in zip(decoded, truth, strict=True)),
    }
