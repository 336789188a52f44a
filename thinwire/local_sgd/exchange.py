"""One fragment's pseudo-gradient on its way across the nodes, in the foreground or behind the
next inner steps.

The average goes through ``SyncState.reduce`` (any thinwire algorithm), one call per bucket, so
what travels and what is kept back are exactly what the gradient algorithms do. With overlap
the reduce runs on a background thread: gloo and NCCL collectives release the GIL while they
wait, so the inner steps compute meanwhile. The thread owns the SyncState until :meth:`wait`;
the caller touches neither the state nor the fragment's buffers before then.
"""

from __future__ import annotations

import logging
import threading

import torch

log = logging.getLogger(__name__)


class Exchange:
    """The average over all ranks of ``flats`` (one flat tensor per bucket), each through
    ``state.reduce(bucket_indices[i], flats[i])``."""

    def __init__(self, state, bucket_indices: list[int], flats: list[torch.Tensor],
                 background: bool):
        self._state = state
        self._indices = bucket_indices
        self._flats = flats
        self._result: list[torch.Tensor] | None = None
        self._error: BaseException | None = None
        self._thread = None
        if background:
            # Not a daemon: if training dies with an exchange in flight, the interpreter waits
            # for the collective to finish or time out (process group timeout) instead of
            # tearing gloo down under a running collective, which aborts the process.
            self._thread = threading.Thread(target=self._run, name="thinwire-diloco-exchange",
                                            daemon=False)
            self._thread.start()
        else:
            self._run()

    def _run(self) -> None:
        try:
            self._result = [self._state.reduce(i, flat)
                            for i, flat in zip(self._indices, self._flats)]
        except BaseException as exc:  # re-raised on the caller's thread by wait(), which
            # reports it once (a lost peer in one line): here only for a debug log
            log.debug("outer exchange failed", exc_info=True)
            self._error = exc

    def wait(self) -> list[torch.Tensor]:
        """The averaged buckets; re-raises the exchange's own error on the caller's thread."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            raise self._error
        return self._result
