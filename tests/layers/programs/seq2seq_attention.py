"""A batched sequence-to-sequence model with attention written as the PyTorch tutorials'
translation and chatbot programs write one: one embedding shared by a bidirectional
two-layer ``nn.GRU`` encoder (``batch_first=True``) over packed sources of different
lengths, whose two directions' outputs are summed; a decoder stepping an ``nn.GRU`` one
token at a time from the encoder's final states, with additive (Bahdanau) attention
written by hand that masks the padding; teacher forcing chosen at random per batch;
``log_softmax`` and ``NLLLoss`` ignoring the padding; two Adam optimizers with gradient
clipping; greedy decoding with ``topk(1)`` and ``.detach()``. The drop-in tests run it
twice, changing only the import line."""

import random

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

PAD, SOS, EOS = 0, 1, 2
VOCAB, MAX_LENGTH = 10, 7


class EncoderRNN(nn.Module):
    def __init__(self, hidden_size, embedding, n_layers=2, dropout=0.1):
        super().__init__()
        self.hidden_size = hidden_size
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.gru = nn.GRU(hidden_size, hidden_size, n_layers, batch_first=True, bidirectional=True)

    def forward(self, input_seq, input_lengths):
        embedded = self.dropout(self.embedding(input_seq))
        packed = pack_padded_sequence(embedded, input_lengths, batch_first=True)
        outputs, hidden = self.gru(packed)
        outputs, _ = pad_packed_sequence(outputs, batch_first=True)
        # sum the two directions' outputs
        outputs = outputs[:, :, : self.hidden_size] + outputs[:, :, self.hidden_size :]
        return outputs, hidden


class BahdanauAttention(nn.Module):
    def __init__(self, hidden_size):
        super().__init__()
        self.Wa = nn.Linear(hidden_size, hidden_size)
        self.Ua = nn.Linear(hidden_size, hidden_size)
        self.Va = nn.Linear(hidden_size, 1)

    def forward(self, query, keys, mask):
        scores = self.Va(torch.tanh(self.Wa(query) + self.Ua(keys))).squeeze(2)
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = F.softmax(scores, dim=-1).unsqueeze(1)
        return torch.bmm(weights, keys), weights


class AttnDecoderRNN(nn.Module):
    def __init__(self, hidden_size, embedding, n_layers=2, dropout=0.1):
        super().__init__()
        self.n_layers = n_layers
        self.embedding = embedding
        self.dropout = nn.Dropout(dropout)
        self.attention = BahdanauAttention(hidden_size)
        self.gru = nn.GRU(2 * hidden_size, hidden_size, n_layers, batch_first=True)
        self.out = nn.Linear(hidden_size, VOCAB)

    def forward_step(self, input, hidden, encoder_outputs, mask):
        embedded = self.dropout(self.embedding(input))  # (B, 1, H)
        query = hidden[-1].unsqueeze(1)  # the top layer's state, (B, 1, H)
        context, weights = self.attention(query, encoder_outputs, mask)
        output, hidden = self.gru(torch.cat((embedded, context), dim=2), hidden)
        return F.log_softmax(self.out(output.squeeze(1)), dim=1), hidden, weights


def make_pairs(n):
    """Reverse-the-sequence pairs: sources of 1 to 5 tokens, targets ending with EOS."""
    pairs = []
    for _ in range(n):
        source = [random.randrange(3, VOCAB) for _ in range(random.randint(1, 5))]
        pairs.append((source, [*source[::-1], EOS]))
    return pairs


def batch(pairs):
    pairs = sorted(pairs, key=lambda p: len(p[0]), reverse=True)
    lengths = torch.tensor([len(s) for s, _ in pairs])
    source = torch.full((len(pairs), int(lengths[0])), PAD)
    target = torch.full((len(pairs), max(len(t) for _, t in pairs)), PAD)
    for i, (s, t) in enumerate(pairs):
        source[i, : len(s)] = torch.tensor(s)
        target[i, : len(t)] = torch.tensor(t)
    return source, lengths, target


def train_step(source, lengths, target, encoder, decoder, optimizers, criterion, ratio):
    for optimizer in optimizers:
        optimizer.zero_grad()
    encoder_outputs, encoder_hidden = encoder(source, lengths)
    mask = source[:, : encoder_outputs.size(1)] != PAD
    decoder_hidden = encoder_hidden[: decoder.n_layers]
    decoder_input = torch.full((source.size(0), 1), SOS)
    use_teacher_forcing = random.random() < ratio
    loss = 0
    for t in range(target.size(1)):
        log_probs, decoder_hidden, _ = decoder.forward_step(
            decoder_input, decoder_hidden, encoder_outputs, mask
        )
        loss = loss + criterion(log_probs, target[:, t])
        if use_teacher_forcing:
            decoder_input = target[:, t].unsqueeze(1)
        else:
            _, topi = log_probs.topk(1)
            decoder_input = topi.detach()
    loss = loss / target.size(1)
    loss.backward()
    nn.utils.clip_grad_norm_(encoder.parameters(), 5.0)
    nn.utils.clip_grad_norm_(decoder.parameters(), 5.0)
    for optimizer in optimizers:
        optimizer.step()
    return loss.item(), use_teacher_forcing


def greedy_decode(source, lengths, encoder, decoder):
    with torch.no_grad():
        encoder_outputs, encoder_hidden = encoder(source, lengths)
        mask = source[:, : encoder_outputs.size(1)] != PAD
        hidden = encoder_hidden[: decoder.n_layers]
        decoder_input = torch.full((source.size(0), 1), SOS)
        tokens, scores, attentions = [], [], []
        for _ in range(MAX_LENGTH):
            log_probs, hidden, weights = decoder.forward_step(
                decoder_input, hidden, encoder_outputs, mask
            )
            score, topi = log_probs.topk(1)
            decoder_input = topi.detach()
            tokens.append(topi.squeeze(1))
            scores.append(score.squeeze(1))
            attentions.append(weights.squeeze(1))
    return torch.stack(tokens, 1), torch.stack(scores, 1), torch.stack(attentions, 1)


def main(dtype=torch.float32, steps=20, hidden_size=12):
    random.seed(5)
    torch.manual_seed(5)
    embedding = nn.Embedding(VOCAB, hidden_size, padding_idx=PAD)
    encoder = EncoderRNN(hidden_size, embedding).to(dtype)
    decoder = AttnDecoderRNN(hidden_size, embedding).to(dtype)
    optimizers = [
        torch.optim.Adam(encoder.parameters(), lr=0.01),
        torch.optim.Adam(decoder.parameters(), lr=0.01 * 5.0),
    ]
    criterion = nn.NLLLoss(ignore_index=PAD)
    pairs = make_pairs(64)
    losses, forced = [], []
    encoder.train()
    decoder.train()
    for step in range(steps):
        chunk = pairs[(step * 8) % len(pairs) :][:8]
        loss, teacher = train_step(
            *batch(chunk), encoder, decoder, optimizers, criterion, ratio=0.5
        )
        losses.append(loss)
        forced.append(teacher)
    encoder.eval()
    decoder.eval()
    source, lengths, target = batch(make_pairs(6))
    tokens, scores, attentions = greedy_decode(source, lengths, encoder, decoder)
    matches = (tokens[:, : target.size(1)] == target) | (target == PAD)
    return {
        "exact": matches.all(dim=1).float().mean().item(),
        "losses": losses,
        "forced": forced,
        "tokens": tokens.tolist(),
        "scores": scores.flatten().tolist(),
        "attentions": attentions.flatten().tolist(),
    }
