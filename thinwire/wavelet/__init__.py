"""Wavelet tick-tock scheduling (Wang et al., MLSys 2021): two training waves per device slot.

For user code under torchrun with two processes per device slot::

    from thinwire.wavelet import TickTock, Wave
    ticktock = TickTock(Wave.from_env(waves=2))    # collective, after init_process_group
    ticktock.attach(module)   # the module DDP wraps: the wait happens inside DDP's forward,
                              # after DDP's own collectives (waiting before them deadlocked)
    for step, (x, y) in enumerate(batches):
        with ticktock.forward(step):               # the tock's forward waits for the tick's
            loss = loss_fn(ddp_model(x), y)
        loss.backward(); opt.step(); opt.zero_grad()
    ticktock.close()

`thinwire train --waves 2` does exactly this with thinwire's models and gradient-sync
algorithms (`thinwire.wavelet.loop`).
"""

from thinwire.wavelet.schedule import (TURNS, WAVES_ALLOWED, TickTock, Wave, WaveDied,
                                       check_turn, check_waves)

__all__ = ["TURNS", "WAVES_ALLOWED", "check_turn", "TickTock", "Wave", "WaveDied", "check_waves"]
