"""Models: language models, taggers, classifiers, encoder–decoders and their parts.

The public names of every module resolve here (``rnnkit.models.LanguageModel``); the
``CONTEXT_MODES`` of ``conditional`` and ``seq2seq`` differ in meaning and stay in their
modules.
"""

from rnnkit.generation.seq2seq_search import beam_search, decode_batch
from rnnkit.models.bow import BOW_C, MAX_FEATURES, BagOfNgrams, fit_logistic
from rnnkit.models.builders import (
    build_embedding,
    build_encoder,
    build_language_model,
    build_length,
    build_lm,
    check_vocab_size,
)
from rnnkit.models.classifier import (
    Classifier,
    FeedForwardHead,
    build_classifier,
    build_vector_classifier,
)
from rnnkit.models.conditional import (
    CONDITIONAL_STATE_DIM,
    ConditionalLM,
    ConditionalState,
    class_conditional_lm,
)
from rnnkit.models.decoder_only import DecoderOnlyTranslator, build_decoder_only, joint_sequences
from rnnkit.models.heads import TiedHead
from rnnkit.models.jordan import NONLINEARITIES, JordanLM, jordan_lm
from rnnkit.models.language_model import (
    LanguageModel,
    LMOutput,
    LossOutput,
    check_token_ids,
    reset_rows,
)
from rnnkit.models.length import (
    LENGTH_MODES,
    LengthState,
    LengthTargets,
    SequenceLength,
    length_targets,
)
from rnnkit.models.lookup import (
    MAX_NEIGHBOURS,
    MostFrequentTag,
    NearestNeighbour,
    levenshtein_many,
)
from rnnkit.models.ngram import NGramModel, count_table_size
from rnnkit.models.pooling import (
    POOLINGS,
    Pooling,
    directions_side_by_side,
    last_pool,
    max_pool,
    mean_pool,
    state_pool,
)
from rnnkit.models.regressor import LOG_VAR_MAX, LOSSES, TARGETS, Regressor, RegressorOutput
from rnnkit.models.seq2seq import ATTENTION_WIRINGS, Seq2Seq, Seq2SeqOutput, build_seq2seq
from rnnkit.models.seq2seq_decoder import STATE_BATCH_DIM, DecoderState, check_stepped_decoder
from rnnkit.models.seq2seq_inference import InferenceStep
from rnnkit.models.seq2seq_torch_step import TorchInferenceStep
from rnnkit.models.spec import TASK_MODEL_DEFAULTS, TASKS, ModelSpec, task_model_defaults
from rnnkit.models.tagger import CHAR_EMBEDDING, CHAR_HIDDEN, CharEncoder, Tagger, build_tagger

__all__ = [
    "ATTENTION_WIRINGS",
    "BOW_C",
    "CHAR_EMBEDDING",
    "CHAR_HIDDEN",
    "CONDITIONAL_STATE_DIM",
    "LENGTH_MODES",
    "LOG_VAR_MAX",
    "LOSSES",
    "MAX_FEATURES",
    "MAX_NEIGHBOURS",
    "NONLINEARITIES",
    "POOLINGS",
    "STATE_BATCH_DIM",
    "TARGETS",
    "TASKS",
    "TASK_MODEL_DEFAULTS",
    "BagOfNgrams",
    "CharEncoder",
    "Classifier",
    "ConditionalLM",
    "ConditionalState",
    "DecoderOnlyTranslator",
    "DecoderState",
    "FeedForwardHead",
    "InferenceStep",
    "JordanLM",
    "LMOutput",
    "LanguageModel",
    "LengthState",
    "LengthTargets",
    "LossOutput",
    "ModelSpec",
    "MostFrequentTag",
    "NGramModel",
    "NearestNeighbour",
    "Pooling",
    "Regressor",
    "RegressorOutput",
    "Seq2Seq",
    "Seq2SeqOutput",
    "SequenceLength",
    "Tagger",
    "TiedHead",
    "TorchInferenceStep",
    "beam_search",
    "build_classifier",
    "build_decoder_only",
    "build_embedding",
    "build_encoder",
    "build_language_model",
    "build_length",
    "build_lm",
    "build_seq2seq",
    "build_tagger",
    "build_vector_classifier",
    "check_stepped_decoder",
    "check_token_ids",
    "check_vocab_size",
    "class_conditional_lm",
    "count_table_size",
    "decode_batch",
    "directions_side_by_side",
    "fit_logistic",
    "joint_sequences",
    "jordan_lm",
    "last_pool",
    "length_targets",
    "levenshtein_many",
    "max_pool",
    "mean_pool",
    "reset_rows",
    "state_pool",
    "task_model_defaults",
]
