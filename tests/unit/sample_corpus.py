"""A token file of documents with distinct, recognisable tokens, for the tests of what the data layer makes of it
(samples, their order, blends, epochs)."""
from __future__ import annotations

import numpy as np

from pretrain_cli.data.indexed_writer import IndexedDatasetWriter


def corpus(path, n_docs=60, seed=0, base=10, vocab=500):
    """Documents with distinct, recognisable tokens: doc d holds ids base+d*... mod vocab."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(base, vocab, size=int(n)) for n in rng.integers(1, 40, size=n_docs)]
    with IndexedDatasetWriter(path, np.uint16) as w:
        w.add_documents(np.concatenate(docs), [len(d) for d in docs])
        w.finalize()
    return str(path), docs
