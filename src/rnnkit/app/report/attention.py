"""The report's attention section of a seq2seq run: one heatmap per validation pair,
teacher-forced (row t is the step that predicts target token t)."""

from __future__ import annotations

import torch

from rnnkit.app.report.html import image, note, section
from rnnkit.app.report.run import Run, data_file
from rnnkit.diagnostics import plots

__all__ = ["attention_sections"]


def attention_sections(run: Run, pairs_shown: int = 3) -> list[tuple[str, str, str]]:
    """Attention heatmaps (teacher-forced on validation pairs) of a seq2seq run."""
    cfg = run.cfg
    title = "Attention"
    if cfg.decoder_only or cfg.attention == "none":
        return [section("attention", title, note("This model has no attention."))]
    from rnnkit.app.tasks.seq2seq import load_seq2seq
    from rnnkit.data.pairs import encode_pairs, make_pair_batch, read_pairs
    from rnnkit.errors import DataError

    _, source_vocab, target_vocab, model = load_seq2seq(run.path, run.device)
    pairs = None
    # The first validation pairs; without a validation file, the last training pairs
    # (the ones training held out).
    for key, held_out in (("valid", False), ("train", True)):
        for candidate in data_file(run, key):  # the next place where one cannot be read
            try:
                every = read_pairs(candidate)
                pairs = every[-pairs_shown:] if held_out else every[:pairs_shown]
                src, tgt = encode_pairs(pairs, source_vocab, target_vocab, candidate)
                break
            except (DataError, OSError):
                pairs = None
        if pairs:
            break
    if not pairs:
        return [section("attention", title, note("No readable source<TAB>target pairs."))]
    batch = make_pair_batch(src, tgt)  # on the host: its ids label the pictures
    device = next(model.parameters()).device
    with torch.no_grad():
        given = (batch.source, batch.source_mask, batch.target_in, batch.target_mask)
        out = model(*(t.to(device) for t in given))
    if out.attention is None:
        return [section("attention", title, note("The model returned no attention weights."))]
    body = ""
    for i, pair in enumerate(pairs):
        S, M = len(src[i]), len(tgt[i]) + 1  # outputs y_1 … y_m </s>
        weights = out.attention[i, :M, :S].double().cpu().numpy()
        labels = [target_vocab.itos[j] for j in batch.target_out[i, :M].tolist()]
        fig = plots.plot_attention(
            weights,
            [source_vocab.itos[j] for j in src[i].tolist()],
            labels,
            title=f"Attention, pair {i + 1}",
        )
        body += image(
            fig,
            f"attention heatmap of pair {i + 1}",
            f"{pair.source} → {pair.target} (teacher forcing: row t is the step "
            "that predicts the target token on the left).",
        )
    return [section("attention", title, body)]
