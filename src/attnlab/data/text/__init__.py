"""Text data: corpora and where they come from, tokenizers, token arrays, the samples language models train on, and
labelled sentences for classification (GLUE)."""
