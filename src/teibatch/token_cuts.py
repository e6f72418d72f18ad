"""Where a tokenizer's counts add up when a text is cut: the ``cuts`` value every token counter has.

Re-tokenizing a piece of a text can give another count than the piece's share of the whole text's
tokens (a WordPiece ``##`` piece that starts the piece, a BPE merge across its edge). A counter's
``cuts`` says where its counts are additive, so the chunker knows when it can count by slicing and
when it must count the piece again:

* ``tokens``: a slice between any two token edges counts exactly its tokens (the hashing rule);
* ``whitespace``: the same, but only for edges with whitespace between the two tokens (tokenizers
  that split words at whitespace and tokenize each word alone: BERT's WordPiece models and the like);
* ``none``: no promise; every chunk is counted again as sent.

The values live here, outside ``corpus`` and ``tei``, because counters of both packages carry them
and ``tei`` must not import ``corpus`` (which loads pyarrow).
"""

from __future__ import annotations

CUTS_TOKENS = "tokens"
CUTS_WHITESPACE = "whitespace"
CUTS_NONE = "none"
CUTS = (CUTS_TOKENS, CUTS_WHITESPACE, CUTS_NONE)
