"""Data: vocabularies, text corpora and batching (streams for truncated BPTT, padded buckets)."""

from rnnkit.data.batch_resume import IterableBatches
from rnnkit.data.batching import SequenceBatch, SequenceBatcher, lm_pairs, pad_sequences
from rnnkit.data.streams import StreamBatch, StreamBatcher
from rnnkit.data.text import (
    build_vocab_from_file,
    encode_corpus,
    encode_text,
    read_lines,
    read_numbered_lines,
    read_text,
)
from rnnkit.data.vocab import (
    BOS_ID,
    EOS_ID,
    NEVER_GENERATED,
    PAD_ID,
    SPECIALS,
    UNITS,
    UNK_ID,
    Vocabulary,
    count_tokens,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "NEVER_GENERATED",
    "PAD_ID",
    "SPECIALS",
    "UNITS",
    "UNK_ID",
    "IterableBatches",
    "SequenceBatch",
    "SequenceBatcher",
    "StreamBatch",
    "StreamBatcher",
    "Vocabulary",
    "build_vocab_from_file",
    "count_tokens",
    "encode_corpus",
    "encode_text",
    "lm_pairs",
    "pad_sequences",
    "read_lines",
    "read_numbered_lines",
    "read_text",
]
