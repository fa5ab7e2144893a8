"""Training pieces of the events task: a long session is cut into pieces that cover
each prediction once."""

from __future__ import annotations

import numpy as np

from rnnkit.app.tasks.events.train import _pieces
from rnnkit.data.vocab import EOS_ID


def test_pieces_cover_a_long_session_once() -> None:
    seq = np.arange(4, 14)  # 10 events: 11 predictions with the end
    pieces = _pieces(seq, 4)
    assert [len(x) for x, _ in pieces] == [4, 4, 3]
    targets = np.concatenate([y for _, y in pieces])
    assert targets.tolist() == [*seq.tolist(), EOS_ID]
    # A later piece starts from the event before its first target.
    assert pieces[1][0][0] == pieces[0][1][-1]
