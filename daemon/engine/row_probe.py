"""Whether a row's bits here depend on how many rows of its sequence share its pass, asked of the
loaded model and build once, on a sequence without cells, before the daemon serves (the service
asks whether sessions may draft; docs/determinism.md).

Speculative verification decodes a token with its drafts in one pass and keeps what it samples
from each row; that is exact only where each row gets the bits the same token gets decoded alone.
Which kernels llama.cpp's CPU backend takes depends on the build (llamafile's sgemm or not, and
sinkd's patch of it: `sgemm_float_rows`), the weights' types and the CPU, so the engine decodes a
few tokens both ways on the real model and compares every logit. A difference is a reason not to
draft; equality where the build says rows may differ is not trusted either (the difference of a
lone row is a last bit that shows at most places, not all).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as llama
import numpy as np

from sinkd.daemon.engine.cells import SequenceCells
from sinkd.daemon.engine.decoding import Decoder
from sinkd.daemon.engine.vocab import Vocabulary

HISTORY = 8  # tokens read first, as one piece
ROWS = 6  # then these, one at a time and as one pass
TEXT = "Dec  5 10:07:42 web sshd[1037]: Accepted publickey for alice from 10.0.1.21 port 40113"


def sgemm_float_rows() -> bool:
    """Whether this llama.cpp's sgemm takes a lone row of floats (attention's products) as it
    takes a pass of several: sinkd's patch (deploy/llama.cpp/sgemm-float-rows.patch) says so by
    a symbol of ggml's CPU library."""
    bindings = getattr(llama, "llama_cpp", None)  # its libraries' folder (LLAMA_CPP_LIB_PATH)
    base = Path(getattr(bindings, "_base_path", Path(llama.__file__).parent / "lib"))
    for path in sorted(base.glob("libggml-cpu.*")):
        try:
            lib = ctypes.CDLL(str(path))
        except OSError:
            continue
        probe = getattr(lib, "sinkd_sgemm_float_rows", None)
        return probe is not None and bool(probe())
    return False


def rows_differ(
    decoder: Decoder, cells: SequenceCells, vocab: Vocabulary, seq_id: int
) -> str | None:
    """Decode HISTORY + ROWS tokens of a log line on the empty sequence `seq_id`: the last ROWS
    one at a time, then again as one pass with every row asked; None where every row's logits
    are equal, else which row differed. The sequence is left empty."""
    tokens = (vocab.tokenize(TEXT) * 4)[: HISTORY + ROWS]
    try:
        decoder.decode_chunk(seq_id, tokens[:HISTORY], 0, "none")
        alone = []
        for i in range(HISTORY, HISTORY + ROWS):
            got = decoder.decode_chunk(seq_id, [tokens[i]], i, "last")
            assert got is not None
            alone.append(got)
        cells.remove(seq_id, HISTORY, -1)
        together = np.empty((ROWS, decoder.n_vocab), np.float32)
        decoder.decode_chunk(seq_id, tokens[HISTORY:], HISTORY, "all", together)
    finally:
        cells.clear(seq_id)
    for row, (a, b) in enumerate(zip(alone, together, strict=True)):
        if not np.array_equal(a, b):
            return f"row {row + 1} of a pass of {ROWS} differs from the same token decoded alone"
    return None
